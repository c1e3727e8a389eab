"""An empty key/value cache laid out for a model: the one thing the forward and the drafters both build."""

from __future__ import annotations


def new_cache(model) -> object:
    """An empty ``DynamicCache`` laid out for ``model``'s layers, as ``DynamicCache(config=…)`` builds it.

    Reading the layer layout from the config costs more than a tiny model's whole forward, and
    a run builds two caches; the layout is read once per model and each cache is built from it.
    """
    from transformers import DynamicCache

    # Kept with the config it was read from: an early-exit shell is a shallow copy of its target
    # (so it inherits the attribute) with a config of its own, which must not reuse the target's.
    config, layout = getattr(model, "_diagnostics_cache_layout", (None, 0))
    if config is not model.config:
        layout = _cache_layout(model.config)
        try:
            model._diagnostics_cache_layout = (model.config, layout)
        except AttributeError:  # a frozen or slotted object: read the layout every time
            pass
    if not layout:  # a layout other than one full-attention layer per layer: the library builds it
        return DynamicCache(config=model.config)
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    cache.layers.extend(DynamicLayer() for _ in range(layout))
    return cache


def _cache_layout(config) -> int:
    """The number of layers when every layer is plain full attention (``DynamicLayer``), else 0."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    layer_types, per_layer_kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    plain = all(kind == "full_attention" for kind in layer_types) and not any(per_layer_kwargs)
    return len(layer_types) if plain else 0


__all__ = ["new_cache"]
