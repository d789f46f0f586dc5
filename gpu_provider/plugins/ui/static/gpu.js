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
      const error = new Error(`${path}: HTTP ${response.status} ${detail}`);
      error.status = response.status;
      throw error;
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

  function taskCell(row) {
    // DAG, task and run in one cell (the run below, smaller): the tables fit Airflow's frame at 1280 px
    const task = row.task_id === null || row.task_id === undefined ? "–" : row.task_id + (row.map_index >= 0 ? `[${row.map_index}]` : "");
    return el("td", { class: "task" }, el("span", { class: "dag" }, row.dag_id || "(unknown DAG)"), " / ", task,
      el("div", { class: "run muted" }, row.run_id || ""));
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

  // the backend an attempt ran on, with its region where a capacity ladder's rung named one
  function backendText(r) {
    return r.region ? `${r.backend} (${r.region})` : r.backend;
  }

  // the capacity tag, then the instance type that ran and its hourly price, where known
  function capacityCell(r) {
    const type = r.instance_type
      ? ` ${r.instance_type}` + (typeof r.usd_per_hour === "number" ? ` ($${r.usd_per_hour.toFixed(2)}/h)` : "")
      : "";
    return [el("span", { class: "tag" }, r.capacity), type];
  }

  function renderRunning(data) {
    const rows = data.running.map((r) => el("tr", { "data-job": r.job_id },
      taskCell(r), teamCell(r.team), el("td", null, backendText(r)), el("td", null, ...capacityCell(r)),
      el("td", null, r.state + (r.live ? "" : " (recorded)")),
      el("td", { class: "num" }, `${r.gpus_per_node} × ${r.nodes}`),
      el("td", { class: "num" }, r.running_for_s === null ? "queued" : duration(r.running_for_s)),
      el("td", { class: "num" }, money(r.cost_usd)), links(r)));
    // jobs no record of these DAGs knows (a deleted DAG, a worker that crashed before saving): they bill too
    for (const u of data.untracked || []) {
      rows.push(el("tr", { "data-job": u.job_id, class: "untracked" },
        taskCell(u), teamCell(u.team), el("td", null, u.backend), el("td", null, el("span", { class: "tag" }, u.capacity)),
        el("td", null, `${u.state} (untracked: no attempt record)`),
        el("td", { class: "num" }, `${u.gpus} GPU(s), ${u.nodes} node(s)`),
        el("td", { class: "num" }, u.running_for_s === null ? "queued" : duration(u.running_for_s)),
        el("td", { class: "num" }, "–"), el("td", { class: "muted" }, u.job_name)));
    }
    fill(document.querySelector("#running tbody"), rows, 9, "No GPU attempt is running.");
    const untracked = (data.untracked || []).length;
    document.getElementById("running-count").textContent =
      `(${data.running.length}${untracked ? `, and ${untracked} untracked job${untracked > 1 ? "s" : ""}` : ""})`;
  }

  function renderRecent(data) {
    const rows = data.attempts.map((r) => el("tr", { "data-job": r.job_id, "data-end": r.end },
      el("td", { class: "when" }, when(r.ended_at)), taskCell(r), teamCell(r.team),
      el("td", { class: "attempt" }, `#${r.attempt} `, backendText(r), " ", ...capacityCell(r)),
      el("td", { class: `end end-${r.end}` }, r.end.replace(/_/g, " ") +
        (typeof r.spot_return_saving_usd === "number" ? ` (saves ~$${r.spot_return_saving_usd.toFixed(2)})` : "")),
      el("td", { class: "reason" }, r.reason || ""), el("td", { class: "num" }, hours(r.gpu_hours)),
      el("td", { class: "num" }, money(r.cost_usd)), links(r)));
    fill(document.querySelector("#recent tbody"), rows, 9, "No attempt ended in the last 30 days.");
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
    return { width, height, left: 58, right: 10, top: 10, bottom: 38 };
  }

  function axes(node, f, yAxis) {
    // the server's ticks and labels (distinct, with the decimals small amounts need)
    const plotH = f.height - f.top - f.bottom;
    yAxis.ticks.forEach((value, i) => {
      const y = f.top + plotH - (plotH * value) / yAxis.max;
      node.append(svg("line", { x1: f.left, x2: f.width - f.right, y1: y, y2: y, class: "axis" }));
      node.append(svg("text", { x: f.left - 4, y: y + 4, "text-anchor": "end", class: "y-label" }, yAxis.labels[i]));
    });
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

  function drawGpus(data) {
    // a step chart of the exact GPU count per team, over the part of the window that has data
    const node = document.getElementById("chart-gpus");
    const f = frame(node);
    const teams = Object.keys(data.steps);
    const t0 = Date.parse(data.span.start), t1 = Math.max(Date.parse(data.span.end), t0 + 1000);
    const plotW = f.width - f.left - f.right, plotH = f.height - f.top - f.bottom;
    const x = (t) => f.left + (plotW * (t - t0)) / (t1 - t0), y = (v) => f.top + plotH - (plotH * v) / data.y_axis.max;
    axes(node, f, data.y_axis);
    // times as precise as the span needs for the three labels to differ
    const span = t1 - t0;
    [t0, (t0 + t1) / 2, t1].forEach((t, i) => {
      const iso = new Date(t).toISOString();
      const text = span <= 20 * 60000 ? iso.slice(11, 19) : span <= 2 * 86400000 ? iso.slice(11, 16) : iso.slice(5, 10) + " " + iso.slice(11, 16);
      node.append(svg("text", { x: x(t), y: f.height - f.bottom + 14, "text-anchor": ["start", "middle", "end"][i], class: "x-label" }, text));
    });
    for (const team of teams) {
      const points = data.steps[team].map(([iso, v]) => [Date.parse(iso), v]);
      let d = `M ${x(t0)} ${y(0)}`;
      for (const [t, v] of points) d += ` H ${x(t)} V ${y(v)}`;
      d += ` H ${x(t1)}`;
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
    const maxY = data.y_axis.max;
    const plotW = f.width - f.left - f.right, plotH = f.height - f.top - f.bottom;
    const slot = plotW / n, barW = Math.max(2, slot * 0.7);
    axes(node, f, data.y_axis);
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
        // the team table needs read access to pools: without it the rest of the page still shows
        get("api/summary").catch((err) => (err.status === 403 ? null : Promise.reject(err))),
        get("api/running"), get(`api/attempts?offset=${state.offset}&limit=${PAGE}`),
        get(`api/gpus_in_use?window=${w}`), get("api/daily_cost?days=30"),
      ]);
      const teamsSection = document.getElementById("teams-section");
      teamsSection.hidden = summary === null;
      document.getElementById("teams-refused").hidden = summary !== null;
      if (summary) {
        summary.teams.forEach((t) => color(t.team));
        renderTeams(summary);
      }
      renderRunning(running);
      renderRecent(recent);
      drawGpus(gpus);
      drawCost(cost);
      const meta = summary || running;
      const notes = meta.live_errors.map((e) => `Live state: ${e}`);
      (meta.unswept || []).forEach((u) => notes.push(`Not swept by the reaper: ${u}`));
      if (meta.truncated) notes.push(`Only the newest ${meta.max_task_rows} task instances are counted.`);
      showErrors(notes);
      document.getElementById("status").textContent = `updated ${when(meta.generated_at)}`;
      document.getElementById("footer").textContent =
        `airflow-provider-gpu ${meta.version} · live state from: ${meta.live_backends.join(", ") || "none"} · ` +
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
