"""PDM training: data, teacher cache, aligned training (design §7)."""
