"""Alerting and recording rules evaluated by the query API on its own PromQL.

:mod:`.rulefile` reads Prometheus-format rule files, :mod:`.template` fills alert
labels and annotations, :mod:`.manager` evaluates groups and keeps alert state,
:mod:`.notifier` sends alerts to Alertmanager, :mod:`.selfmetrics` makes Kelvin's
own service metrics queryable by rules. ``hall.yaml`` holds the default rules.
"""
