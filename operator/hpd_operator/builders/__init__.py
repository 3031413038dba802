"""hybrid-pd-operator."""
