"""Thin HTTP handlers over the service layer (Litestar, served by Granian)."""
