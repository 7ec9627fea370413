"""The EngineTuner kind, VPA's three roles for an engine made by another stack: finding and reading its target
(``target``), the recommender (``target_handlers``, ``target_loop``), the admission webhook
(``target_webhook``,
``webhook_tls``) and its registrations (``target_main``)."""
