"""Headway: store."""
