"""The GPU page: an Airflow plugin (:mod:`.plugin`) serving a page and JSON endpoints (:mod:`.app`)."""
