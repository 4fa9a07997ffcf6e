"""Management commands of the lease_lock Django app."""
