"""Dagster definitions built from pipeline definitions (thin in the engine slice)."""
