"""Headway: sdk."""
