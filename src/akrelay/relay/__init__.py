"""The service layer: the only place where the protocol core meets storage."""
