"""What a run is made of, as checked data: scenario and profile schema (config), bounds, errors, units, shipped data
(resources). Reading YAML into it (file:line errors, --set overrides) is sosim.run.loader."""
