"""One run, end to end, above the systems and below the formats that read and draw it: a scenario loaded and
resolved (loader: YAML with file:line errors, --set overrides, the system's knobs, the profile's tables), simulated
(simulate: the cost object, the system's plan, an engine) and its Result (result: metrics and breakdown)."""
