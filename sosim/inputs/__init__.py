"""What a run is made of, read and checked: scenario and profile schema (config), YAML loading with
file:line errors and --set overrides (loader), bounds, errors, units, shipped data (resources)."""
