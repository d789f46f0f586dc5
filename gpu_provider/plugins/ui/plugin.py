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

import threading
from typing import Any

from airflow.plugins_manager import AirflowPlugin

#: where the API server mounts the page's app
URL_PREFIX = "/gpu"


class LazyApp:
    """An ASGI app that builds the page's FastAPI app on its first request.

    Every Airflow component loads plugins (the scheduler, the DAG processor, task runs), but only the
    API server serves the page: the app and the API modules it imports (about a second or more of
    imports) are built there, when first asked, not wherever the plugin is loaded.
    """

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = threading.Lock()

    def app(self) -> Any:
        with self._lock:
            if self._app is None:
                from gpu_provider.plugins.ui.app import create_app

                self._app = create_app()
            return self._app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app()(scope, receive, send)


class GpuUiPlugin(AirflowPlugin):
    name = "gpu_provider_ui"
    fastapi_apps = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "GPU jobs"}]
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
