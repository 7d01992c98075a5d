"""Slot policy (settings validation, effective values) and the pure grant function."""
