"""Forward-only SQL migrations, installed as ``effectgate.migrations`` and read as package data."""
