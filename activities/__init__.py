"""Headway: activities."""
