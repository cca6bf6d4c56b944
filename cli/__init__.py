"""Headway: cli."""
