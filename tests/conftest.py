pytest_plugins = ["e2e.pytest_fixtures"]
