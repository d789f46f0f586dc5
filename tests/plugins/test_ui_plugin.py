"""The GPU page's Airflow plugin: found through its entry point, a valid plugin, cheap to load where
the page is not served (every Airflow component loads plugins)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_plugin_is_registered_under_the_entry_point_airflow_loads() -> None:
    found = {ep.value for ep in entry_points(group="airflow.plugins") if ep.name == "gpu_provider_ui"}
    assert found == {"gpu_provider.plugins.ui.plugin:GpuUiPlugin"}  # the installed distribution's metadata
    from airflow.plugins_manager import is_valid_plugin

    from gpu_provider.plugins.ui.plugin import GpuUiPlugin as plugin

    assert is_valid_plugin(plugin)
    assert plugin.name == "gpu_provider_ui"
    (view,) = plugin.external_views
    assert (view["name"], view["href"], view["url_route"], view["destination"]) == ("GPU", "/gpu/", "gpu", "nav")
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == "/gpu"


def test_loading_the_plugin_does_not_build_the_page_app() -> None:
    code = (
        "import sys, airflow.plugins_manager; import gpu_provider.plugins.ui.plugin; "
        "print(sorted(m for m in ('gpu_provider.plugins.ui.app', 'airflow.api_fastapi.core_api.security') "
        "if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
