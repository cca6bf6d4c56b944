"""Headway: worker."""
