pytest_plugins = ["effectgate.testing.pytest_plugin"]
