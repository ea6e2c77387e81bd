"""Kiln's IRs: pure data with canonical serializations. Imports nothing else of Kiln."""
