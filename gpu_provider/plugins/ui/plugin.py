"""The Airflow plugin that adds the **GPU** page to the Airflow UI (entry point ``gpu_provider_ui``).

Registered through the ``airflow.plugins`` entry point: Airflow 3.3 loads those in every component
whatever ``[core] lazy_discover_providers`` says, while a provider's ``plugins`` in its provider info
are loaded only with ``lazy_discover_providers = False`` (and registering both would load it twice).

The page is a FastAPI app on the API server (``fastapi_apps``, at ``/gpu``) that serves JSON
endpoints and a self-contained page (HTML, JavaScript and SVG shipped in the package: no build step,
nothing fetched at run time), shown in Airflow's navigation as an external view whose route
(``/plugin/gpu``) embeds it. An external view rather than a React app: a React app must be a bundle
built against the UI's React version; a plain page needs nothing but the browser.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from gpu_provider.plugins.ui.app import create_app

#: where the API server mounts the page's app
URL_PREFIX = "/gpu"


class GpuUiPlugin(AirflowPlugin):
    name = "gpu_provider_ui"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "GPU jobs"}]
    external_views = [
        {
            "name": "GPU",
            "href": f"{URL_PREFIX}/",
            "icon": f"{URL_PREFIX}/icon.svg",
            "url_route": "gpu",
            "destination": "nav",
            "nav_top_level": True,
        }
    ]
