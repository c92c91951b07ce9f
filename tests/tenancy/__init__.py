import pytest

# The shared cross-tenant helpers live outside test modules; let pytest rewrite their
# asserts so a failure shows the response instead of a bare AssertionError.
pytest.register_assert_rewrite("tests.tenancy.isolation")
