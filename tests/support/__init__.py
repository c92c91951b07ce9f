"""Test support code shared by the test suites (no Django imports here)."""
