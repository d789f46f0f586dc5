"""The attempt loop apart from Airflow: decisions (:mod:`.attempts`), watching one attempt
(:mod:`.watch`) and reading its log (:mod:`.logs`). The operator and the trigger are thin adapters."""
