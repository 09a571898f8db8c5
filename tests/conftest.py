pytest_plugins = ["e2e.pytest_fixtures", "e2e.pytest_stress"]
