"""Use cases over the ports in ``rightsizer.ports``: snapshot, plan, drain steps, off-hours."""
