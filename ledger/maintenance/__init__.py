"""Maintenance services and who runs them: the scheduler (reconciler), rescuer, waker, retention, partitions,
sweeps."""
