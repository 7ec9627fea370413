"""The InferenceService kind: its reconcile (``handlers``, ``desired``), drift repair (``drift``), autoscaler
checks (``autoscalers``), ``kvpilot render`` (``render``) and its closed loop (``closed_loop``)."""
