"""Tests for netcl.text (a package so test module basenames cannot clash with other test folders)."""
