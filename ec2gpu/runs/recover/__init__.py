"""When something ends a run early: spot recovery (instance after instance, resuming from the
checkpoint) and reconciling runs whose controller died without closing them."""
