"""A Keras 3 fake-quantization layer registered for serialization, so that a ``.keras`` file using it loads
in another process (the CLI tests pass ``--import keras3_layers`` with tests/ on the path).

It calls Keras 3's own ``keras.quantizers.fake_quant_with_min_max_vars`` with trainable range variables:
per tensor (``axis=None``) or per channel along ``axis`` (Keras then quantizes with TF's per-channel op,
wrapped in a Transpose pair when ``axis`` is not the last).
"""
from __future__ import annotations

import keras


@keras.saving.register_keras_serializable(package="tests_keras3")
class FakeQuant(keras.layers.Layer):
    def __init__(self, init_min=-3.0, init_max=3.0, num_bits=8, narrow_range=False, axis=None, **kwargs):
        super().__init__(**kwargs)
        self.init_min, self.init_max = float(init_min), float(init_max)
        self.num_bits, self.narrow_range, self.axis = int(num_bits), bool(narrow_range), axis

    def build(self, input_shape):
        shape = () if self.axis is None else (input_shape[self.axis],)
        self.range_min = self.add_weight(name="range_min", shape=shape, trainable=True,
                                         initializer=keras.initializers.Constant(self.init_min))
        self.range_max = self.add_weight(name="range_max", shape=shape, trainable=True,
                                         initializer=keras.initializers.Constant(self.init_max))

    def call(self, x):
        return keras.quantizers.fake_quant_with_min_max_vars(
            x, self.range_min, self.range_max, num_bits=self.num_bits, narrow_range=self.narrow_range, axis=self.axis
        )

    def get_config(self):
        return {**super().get_config(), "init_min": self.init_min, "init_max": self.init_max,
                "num_bits": self.num_bits, "narrow_range": self.narrow_range, "axis": self.axis}
