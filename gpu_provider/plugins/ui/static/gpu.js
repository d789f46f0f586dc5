// The GPU page: reads the JSON endpoints next to it (same origin, Airflow's session cookie) and draws
// tables and two SVG charts. No framework, nothing fetched from elsewhere. Every value from the API
// goes into the page as text (textContent), never as HTML.
"use strict";

(function () {
  const PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#9ca3af"];
  const REFRESH_MS = 30000;
  const PAGE = 25;
  const SVG = "http://www.w3.org/2000/svg";
  const state = { window: "day", offset: 0, colors: {} };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (key === "class") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  async function get(path) {
    const response = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) {
      let detail = response.statusText;
      try { detail = (await response.json()).detail || detail; } catch (e) { /* not JSON */ }
      throw new Error(`${path}: HTTP ${response.status} ${detail}`);
    }
    return response.json();
  }

  function color(team) {
    if (!(team in state.colors)) state.colors[team] = PALETTE[Object.keys(state.colors).length % PALETTE.length];
    return state.colors[team];
  }

  const money = (v) => (v === null || v === undefined ? "–" : "$" + Number(v).toFixed(Number(v) < 10 ? 4 : 2));
  const hours = (v) => (v === null || v === undefined ? "–" : Number(v).toFixed(Number(v) < 10 ? 4 : 1));

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const s = Math.max(0, Math.round(seconds));
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${s % 60}s`;
    return `${s}s`;
  }

  function when(iso) {
    if (!iso) return "–";
    const date = new Date(iso);
    return date.toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  function teamCell(team) {
    return el("td", null, el("span", { class: "swatch", style: `background:${color(team)}` }), team);
  }

  function tiLink(row) {
    // the task instance page of Airflow's UI (this page is served at <base>/gpu/)
    let href = `../dags/${encodeURIComponent(row.dag_id)}/runs/${encodeURIComponent(row.run_id)}/tasks/${encodeURIComponent(row.task_id)}`;
    if (row.map_index >= 0) href += `/mapped/${row.map_index}`;
    return href;
  }

  function links(row) {
    const cell = el("td");
    cell.append(el("a", { href: tiLink(row), target: "_top", class: "ti-link" }, "task instance"));
    for (const [key, label] of [["console_url", "console"], ["logs_url", "logs"]]) {
      const url = row[key];
      if (typeof url === "string" && /^https?:\/\//.test(url)) {
        cell.append(" · ", el("a", { href: url, target: "_blank", rel: "noopener noreferrer", class: key }, label));
      }
    }
    return cell;
  }

  function fill(tbody, rows, columns, empty) {
    tbody.replaceChildren();
    if (!rows.length) {
      tbody.append(el("tr", { class: "empty" }, el("td", { colspan: columns }, empty)));
    }
    for (const row of rows) tbody.append(row);
  }

  function rates(team) {
    const byCapacity = (team.interruption_rate || {})[state.window] || {};
    const parts = Object.entries(byCapacity).map(([capacity, r]) =>
      `${capacity}: ${r.interrupted}/${r.attempts}` + (r.rate === null ? "" : ` (${Math.round(r.rate * 100)}%)`));
    return parts.length ? parts.join(", ") : "no ended attempts";
  }

  function renderTeams(summary) {
    const rows = summary.teams.map((t) => el("tr", { "data-team": t.team },
      teamCell(t.team),
      el("td", { class: "num slots" }, t.slots_total === null ? (t.pool ? `${t.slots_in_use} / unlimited` : "no pool") : `${t.slots_in_use} / ${t.slots_total}`),
      el("td", { class: "num" }, t.tasks_waiting),
      el("td", { class: "num" }, t.jobs_waiting),
      el("td", { class: "num" }, t.gpus_running),
      el("td", { class: "num gpu-hours" }, hours(t.gpu_hours[state.window])),
      el("td", { class: "num cost" }, money(t.cost_usd[state.window])),
      el("td", { class: "rates" }, rates(t))));
    fill(document.querySelector("#teams tbody"), rows, 8, "No GPU pools and no GPU attempts in the last 30 days.");
  }

  function renderRunning(data) {
    const rows = data.running.map((r) => el("tr", { "data-job": r.job_id },
      el("td", null, r.dag_id), el("td", null, r.task_id + (r.map_index >= 0 ? `[${r.map_index}]` : "")), el("td", null, r.run_id),
      teamCell(r.team), el("td", null, r.backend), el("td", null, el("span", { class: "tag" }, r.capacity)),
      el("td", null, r.state + (r.live ? "" : " (recorded)")),
      el("td", { class: "num" }, `${r.gpus_per_node} × ${r.nodes}`),
      el("td", { class: "num" }, r.running_for_s === null ? "queued" : duration(r.running_for_s)),
      el("td", { class: "num" }, money(r.cost_usd)), links(r)));
    fill(document.querySelector("#running tbody"), rows, 11, "No GPU attempt is running.");
    document.getElementById("running-count").textContent = `(${data.running.length})`;
  }

  function renderRecent(data) {
    const rows = data.attempts.map((r) => el("tr", { "data-job": r.job_id, "data-end": r.end },
      el("td", { class: "num" }, when(r.ended_at)), el("td", null, r.dag_id),
      el("td", null, r.task_id + (r.map_index >= 0 ? `[${r.map_index}]` : "")), el("td", null, r.run_id),
      teamCell(r.team), el("td", { class: "num" }, r.attempt), el("td", null, r.backend),
      el("td", null, el("span", { class: "tag" }, r.capacity)),
      el("td", { class: `end end-${r.end}` }, r.end.replace("_", " ")),
      el("td", { class: "reason" }, r.reason || ""), el("td", { class: "num" }, hours(r.gpu_hours)),
      el("td", { class: "num" }, money(r.cost_usd)), links(r)));
    fill(document.querySelector("#recent tbody"), rows, 13, "No attempt ended in the last 30 days.");
    const last = Math.min(data.offset + data.limit, data.total);
    document.getElementById("recent-count").textContent = `(${data.total} in the last 30 days)`;
    document.getElementById("page").textContent = data.total ? `${data.offset + 1}–${last} of ${data.total}` : "";
    document.getElementById("prev").disabled = data.offset === 0;
    document.getElementById("next").disabled = last >= data.total;
  }

  function frame(node) {
    const box = node.getBoundingClientRect();
    const width = Math.max(320, Math.round(box.width || 600)), height = Math.max(180, Math.round(box.height || 240));
    node.setAttribute("viewBox", `0 0 ${width} ${height}`);
    node.replaceChildren();
    return { width, height, left: 44, right: 10, top: 10, bottom: 38 };
  }

  function axes(node, f, maxY, format) {
    const plotH = f.height - f.top - f.bottom;
    for (let i = 0; i <= 4; i++) {
      const y = f.top + plotH - (plotH * i) / 4;
      node.append(svg("line", { x1: f.left, x2: f.width - f.right, y1: y, y2: y, class: "axis" }));
      node.append(svg("text", { x: f.left - 4, y: y + 4, "text-anchor": "end" }, format((maxY * i) / 4)));
    }
  }

  function legend(node, f, teams) {
    let x = f.left;
    for (const team of teams) {
      node.append(svg("rect", { x, y: f.height - 12, width: 10, height: 10, fill: color(team) }));
      const label = svg("text", { x: x + 14, y: f.height - 3, class: "legend" }, team);
      node.append(label);
      x += 24 + team.length * 7;
    }
  }

  function nice(max) {
    if (max <= 0) return 1;
    const exp = Math.pow(10, Math.floor(Math.log10(max)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * exp >= max) return m * exp;
    return 10 * exp;
  }

  function drawGpus(data) {
    const node = document.getElementById("chart-gpus");
    const f = frame(node);
    const teams = Object.keys(data.teams);
    const n = data.times.length;
    const maxY = nice(Math.max(0, ...teams.flatMap((t) => data.teams[t])));
    const plotW = f.width - f.left - f.right, plotH = f.height - f.top - f.bottom;
    const x = (i) => f.left + (plotW * i) / n, y = (v) => f.top + plotH - (plotH * v) / maxY;
    axes(node, f, maxY, (v) => (Number.isInteger(v) ? String(v) : String(Number(v.toFixed(2)))));
    for (const i of [0, Math.floor(n / 2), n - 1]) {
      const label = new Date(data.times[i]);
      const text = state.window === "day" ? label.toISOString().slice(11, 16) : label.toISOString().slice(5, 10);
      node.append(svg("text", { x: x(i), y: f.height - f.bottom + 14, "text-anchor": i ? (i === n - 1 ? "end" : "middle") : "start" }, text));
    }
    for (const team of teams) {
      const values = data.teams[team];
      let d = `M ${x(0)} ${y(values[0])}`;
      values.forEach((v, i) => { d += ` H ${x(i)} V ${y(v)} H ${x(i + 1)}`; });
      node.append(svg("path", { d, fill: "none", stroke: color(team), "stroke-width": 2, class: "series", "data-team": team }));
    }
    if (!teams.length) node.append(svg("text", { x: f.width / 2, y: f.height / 2, "text-anchor": "middle" }, "no GPU time in this window"));
    legend(node, f, teams);
  }

  function drawCost(data) {
    const node = document.getElementById("chart-cost");
    const f = frame(node);
    const teams = Object.keys(data.teams);
    const n = data.days.length;
    const totals = data.days.map((_, i) => teams.reduce((sum, t) => sum + data.teams[t][i], 0));
    const maxY = nice(Math.max(0, ...totals));
    const plotW = f.width - f.left - f.right, plotH = f.height - f.top - f.bottom;
    const slot = plotW / n, barW = Math.max(2, slot * 0.7);
    axes(node, f, maxY, (v) => "$" + (v >= 10 ? Math.round(v) : v.toFixed(2)));
    data.days.forEach((day, i) => {
      let base = f.top + plotH;
      for (const team of teams) {
        const v = data.teams[team][i];
        if (v <= 0) continue;
        const h = (plotH * v) / maxY;
        base -= h;
        const bar = svg("rect", { x: f.left + i * slot + (slot - barW) / 2, y: base, width: barW, height: Math.max(h, 1), fill: color(team), class: "bar", "data-team": team, "data-day": day });
        bar.append(svg("title", {}, `${team} ${day}: $${v.toFixed(4)}`));
        node.append(bar);
      }
      if (i === 0 || i === n - 1 || i === Math.floor(n / 2)) {
        node.append(svg("text", { x: f.left + i * slot + slot / 2, y: f.height - f.bottom + 14, "text-anchor": "middle" }, day.slice(5)));
      }
    });
    if (!teams.length) node.append(svg("text", { x: f.width / 2, y: f.height / 2, "text-anchor": "middle" }, "no estimated cost in the last 30 days"));
    legend(node, f, teams);
  }

  function showErrors(messages) {
    const box = document.getElementById("errors");
    box.hidden = !messages.length;
    box.textContent = messages.join("\n");
  }

  async function refresh() {
    const w = state.window;
    try {
      const [summary, running, recent, gpus, cost] = await Promise.all([
        get("api/summary"), get("api/running"), get(`api/attempts?offset=${state.offset}&limit=${PAGE}`),
        get(`api/gpus_in_use?window=${w}`), get("api/daily_cost?days=30"),
      ]);
      summary.teams.forEach((t) => color(t.team));
      renderTeams(summary);
      renderRunning(running);
      renderRecent(recent);
      drawGpus(gpus);
      drawCost(cost);
      const notes = summary.live_errors.map((e) => `Live state: ${e}`);
      if (summary.truncated) notes.push(`Only the newest ${summary.max_task_rows} task instances are counted.`);
      showErrors(notes);
      document.getElementById("status").textContent = `updated ${when(summary.generated_at)}`;
      document.getElementById("footer").textContent =
        `airflow-provider-gpu ${summary.version} · live state from: ${summary.live_backends.join(", ") || "none"} · ` +
        "costs are estimates (see the provider's docs: how-to, Spend control)";
      document.body.dataset.loaded = "true";
    } catch (err) {
      showErrors([String(err.message || err)]);
      document.getElementById("status").textContent = "not updated";
    }
  }

  document.getElementById("window").addEventListener("change", (event) => { state.window = event.target.value; refresh(); });
  document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); });
  document.getElementById("next").addEventListener("click", () => { state.offset += PAGE; refresh(); });
  refresh();
  setInterval(refresh, REFRESH_MS);
})();
