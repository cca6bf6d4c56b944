"""Headway: scheduler."""
