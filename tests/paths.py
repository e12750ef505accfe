"""Where the tests' files are, for test modules in any subfolder of tests/."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
FIXTURES = os.path.join(TESTS, "fixtures")
SCRIPTS = os.path.join(TESTS, "scripts")
