"""workbench: looped retrofits of pretrained LMs, and the probes that look inside every loop."""
