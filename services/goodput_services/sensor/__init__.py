"""Sensor: turns heartbeats, steps, exits and host health into signals."""
