"""Package ``zephon.v1``: messages and the DataService stub (generated)."""
