"""PDM training: data, teacher cache, aligned training (DESIGN §7)."""
