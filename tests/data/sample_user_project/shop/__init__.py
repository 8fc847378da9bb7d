"""A user's application: its effect handlers live in ``shop.handlers``."""
