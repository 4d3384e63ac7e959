"""Regression tests of attacks on toolexec: each module reproduces one and shows it fails safely."""
