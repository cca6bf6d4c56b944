"""Headway: workflows."""
