"""The way to a plan: the model's config (``resolve``: ConfigMap or Hub), the vLLM release of the image
(``release``), learned figures (``profiles``) and the tuning mode's choice of plan (``modes``)."""
