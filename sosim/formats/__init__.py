"""Input/output formats: DeepSpeed configs in and out (dsconfig), Hugging Face model configs, JSON,
Perfetto traces, plots, command-line output."""
