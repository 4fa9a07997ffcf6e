"""``manage.py locks``."""
