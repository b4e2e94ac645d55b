"""What each operation costs: the analytic model, measured and published tables, collectives, Grace host
scaling, the training stack, offload mechanisms measured as components. One cost object per run (``model.Costs``)."""
