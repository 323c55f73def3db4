"""Simulated cuzk, cuzk-bench, NVML and host probe: honest stand-ins that model real hardware.

Every number they produce is simulated and labelled so wherever it is shown.
"""
