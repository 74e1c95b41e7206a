"""TensorRT's documented ONNX operator support, as data (read by `trt_readiness`).

Transcribed from onnx-tensorrt's `docs/operators.md` whose header reads "TensorRT 10.15 supports
operators in the inclusive range of opset 9 to opset 24" (the 10.15 GA parser, released 2026-02-02
per its CHANGELOG). Kept as a .py module so it ships inside the wheel with no package-data entry.
To update: replace OPS / UNSUPPORTED / RESTRICTIONS from the newer file and bump SOURCE.
"""

from __future__ import annotations

SOURCE = {
    "tensorrt_version": "10.15",
    "document": "onnx-tensorrt docs/operators.md (Supported ONNX Operators)",
    "url": "https://github.com/onnx/onnx-tensorrt/blob/main/docs/operators.md",
    "opset_min": 9,
    "opset_max": 24,
    # TensorRT 10.0's copy of the same file says "opset 9 to opset 20": older 10.x parsers (JetPack
    # 6
    # ships 10.3) may reject newer opsets, so graphs are best kept at <= 20.
    "portable_opset_max": 20,
}

# ONNX element type name -> the table's type name. Types missing here are unsupported by TensorRT.
ONNX_TO_TRT = {
    "FLOAT": "FP32",
    "FLOAT16": "FP16",
    "BFLOAT16": "BF16",
    "INT32": "INT32",
    "INT64": "INT64",
    "INT8": "INT8",
    "UINT8": "UINT8",
    "BOOL": "BOOL",
    "DOUBLE": "DOUBLE",
    "INT4": "INT4",
    "FLOAT8E4M3FN": "FP8",
    "FLOAT4E2M1": "FP4",
}
IO_TYPES = frozenset(ONNX_TO_TRT.values())  # types a network input/output may have
IO_ONLY_TYPES = {"UINT8": "UINT8 is only supported as a network input or output type"}
CAST_DOWN_TYPES = {"DOUBLE": "TensorRT casts DOUBLE down to FLOAT, clamping to +-FLT_MAX"}

_F = "FP32 FP16 BF16"
_FI = _F + " INT32 INT64"
_FIB = _FI + " BOOL"
_FX = "FP32 FP16"
_ALL_CONST = _F + " FP8 FP4 INT4 INT32 INT64 BOOL"

# op -> space-separated supported types ("Supported: Y" rows of the matrix).
OPS: dict[str, str] = {
    "Abs": _FI,
    "Acos": _F,
    "Acosh": _F,
    "Add": _FI,
    "And": "BOOL",
    "ArgMax": _FI,
    "ArgMin": _FI,
    "Asin": _F,
    "Asinh": _F,
    "Atan": _F,
    "Atanh": _F,
    "Attention": _F + " INT8 FP8",
    "AveragePool": _F,
    "BatchNormalization": _F,
    "BlackmanWindow": _FX,
    "Cast": _FI + " UINT8 BOOL",
    "CastLike": _FI + " UINT8 BOOL",
    "Ceil": _F,
    "Celu": _F,
    "Clip": _F,
    "Concat": _FIB,
    "Constant": _ALL_CONST,
    "ConstantOfShape": _ALL_CONST,
    "Conv": _F,
    "ConvTranspose": _F,
    "Cos": _F,
    "Cosh": _F,
    "CumSum": _F,
    "DeformConv": _FX,
    "DepthToSpace": _FI,
    "DequantizeLinear": "INT8 FP8 FP4 INT4",
    "Div": _FI,
    "Dropout": _F,
    "Einsum": _F,
    "Elu": _F,
    "Equal": _FI,
    "Erf": _F,
    "Exp": _F,
    "Expand": _FIB,
    "EyeLike": _FIB,
    "Flatten": _FIB,
    "Floor": _F,
    "Gather": _FIB,
    "GatherElements": _FIB,
    "GatherND": _FIB,
    "Gelu": _F + " INT8 INT32 INT64",
    "Gemm": _F,
    "GlobalAveragePool": _F,
    "GlobalLpPool": _F,
    "GlobalMaxPool": _F,
    "Greater": _FI,
    "GreaterOrEqual": _FI,
    "GridSample": _FX,
    "GroupNormalization": _F,
    "GRU": _F,
    "HammingWindow": _FX,
    "HannWindow": _FX,
    "HardSigmoid": _F,
    "HardSwish": _F,
    "Hardmax": _F,
    "Identity": _FIB,
    "If": _FIB,
    "ImageScaler": _F,
    "InstanceNormalization": _F,
    "IsInf": _F,
    "IsNaN": _FI,
    "LayerNormalization": _F,
    "LeakyRelu": _F,
    "Less": _FI,
    "LessOrEqual": _FI,
    "Log": _F,
    "LogSoftmax": _F,
    "Loop": _FIB,
    "LRN": _F,
    "LSTM": _F,
    "LpNormalization": _F,
    "LpPool": _F,
    "MatMul": _F,
    "Max": _FI,
    "MaxPool": _F,
    "Mean": _F + " FP8 INT32 INT64",
    "MeanVarianceNormalization": _F,
    "Min": _FI,
    "Mish": _FX,
    "Mod": _FI,
    "Mul": _FI,
    "Neg": _FI,
    "NonMaxSuppression": _FX,
    "NonZero": _FX,
    "Not": "BOOL",
    "OneHot": _FIB,
    "Or": "BOOL",
    "Pad": _FI,
    "ParametricSoftplus": _F,
    "Pow": _FI,
    "PRelu": _F,
    "QuantizeLinear": _F,
    "RandomNormal": _F,
    "RandomNormalLike": _F,
    "RandomUniform": _F,
    "RandomUniformLike": _F,
    "Range": _FI,
    "Reciprocal": _F,
    "ReduceL1": _FI,
    "ReduceL2": _FI,
    "ReduceLogSum": _FI,
    "ReduceLogSumExp": _FI,
    "ReduceMax": _FI,
    "ReduceMean": _FI,
    "ReduceMin": _FI,
    "ReduceProd": _FI,
    "ReduceSum": _FI,
    "ReduceSumSquare": _FI,
    "Relu": _FI,
    "Reshape": _FIB,
    "Resize": _F,
    "ReverseSequence": _FIB,
    "RMSNormalization": _F,
    "RNN": _F,
    "RoiAlign": _FX,
    "RotaryEmbedding": _F,
    "Round": _F,
    "STFT": "FP32",
    "ScaledTanh": _F,
    "Scan": _F,
    "Scatter": _FI,
    "ScatterElements": _FI,
    "ScatterND": _FI,
    "Selu": _F,
    "Shape": _FIB,
    "Shrink": _FI,
    "Sigmoid": _F,
    "Sign": _FI,
    "Sin": _F,
    "Sinh": _F,
    "Size": _FIB,
    "Slice": _FIB,
    "Softmax": _F,
    "Softplus": _F,
    "Softsign": _F,
    "SpaceToDepth": _FI,
    "Split": _FIB,
    "Sqrt": _F,
    "Squeeze": _FIB,
    "Sub": _FI,
    "Sum": _FI,
    "Tan": _F,
    "Tanh": _F,
    "TensorScatter": _F + " INT32",
    "ThresholdedRelu": _F,
    "Tile": _FIB,
    "TopK": _FI,
    "Transpose": _FIB,
    "Trilu": _FIB,
    "Unsqueeze": _FIB,
    "Upsample": _F,
    "Where": _FIB,
    "Xor": "BOOL",
}

# Weight-only low-bit weights (DequantizeLinear on stored weights feeding MatMul / Gather), per
# element type: the TensorRT release that first builds them and the scales it takes. From NVIDIA's
# "Quantization Schemes" page (docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/
# quantized-types-schemes.html): "INT4 quantization requires per-block scales. The supported block
# sizes are {64, 128}. The block dimension should be one of the last two dimensions. TensorRT only
# supports INT4 for weight quantization"; INT8 scales are a scalar (per tensor) or one per channel.
# Symmetric only (zero point 0). Built as a strongly typed network (engines/build.py). INT4 weight-
# only quantization first shipped in TensorRT 10.0; not verified here (no TensorRT on this machine).
WEIGHT_ONLY: dict[str, dict] = {
    "INT4": {"since": "10.0", "blocks": (64, 128), "per_channel": False},
    "INT8": {"since": "8.0", "blocks": (), "per_channel": True},
}
DQ_OPSET = 21  # DequantizeLinear's `block_size` and the INT4 type: opset 21
# TensorRT's own Gather layer takes INT8 / INT4 data (operators/Gather.html: "T1: bool, int4, int8,
# int32, int64, float8, float16, float32, bfloat16"), though onnx-tensorrt's table lists no INT8
GATHER_LAYER_TYPES = ("INT8", "INT4")

# "Supported: N" rows.
UNSUPPORTED = frozenset(
    """
    AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Col2Im CenterCropPad
    Compress ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear ImageDecoder MatMulInteger
    MaxRoiPool MaxUnpool MelWeightMatrix Multinomial NegativeLogLikelihoodLoss Optional
    OptionalGetElement OptionalHasElement QLinearConv QLinearMatMul RegexFullMatch SequenceAt
    SequenceConstruct SequenceEmpty SequenceErase SequenceInsert SequenceLength SequenceMap
    SoftmaxCrossEntropyLoss SplitToSequence StringConcat StringNormalizer StringSplit
    TfIdfVectorizer Unique
""".split()
)

# op -> the documented restriction, paraphrased (reported as a note when the op occurs).
_REDUCE_OPS = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
)
_REDUCE_AXES = "`axes` must be an initializer"
RESTRICTIONS: dict[str, str] = {
    "Attention": "Q, K, V and attn_mask must be 4-D; past_key/past_value/nonpad_kv_seqlen inputs, "
    "present_key/present_value/qk_matmul_output outputs, qk_matmul_output_mode and softcap "
    "unsupported",
    "AveragePool": "2-D or 3-D pooling only; dilations empty or all ones",
    "Constant": "sparse_value, value_string and value_strings attributes unsupported",
    "CumSum": "`axis` must be a build-time constant",
    "DeformConv": "input must have 1-D or 2-D spatial dims; begin/end pads equal per axis",
    "DequantizeLinear": "`x_zero_point` must be zero",
    "Dropout": "`is_training` must be an initializer that evaluates to False",
    "EyeLike": "input must have static dimensions",
    "GridSample": "input must be 4-D",
    "Hardmax": "the `axis` dimension of the input must be a build-time constant",
    "If": "the two branches' outputs must have the same rank and different names",
    "LayerNormalization": "only the first output `Y` is supported",
    "Loop": "scan output length cannot be dynamic; loop-carried shapes must not change across "
    "iterations",
    "LSTM": "bidirectional: same activations both ways; input_forget and layout must be 0",
    "LpPool": "dilations empty or all ones",
    "MaxPool": "2-D or 3-D pooling only; `Indices` output unsupported; dilations empty or all ones",
    "OneHot": "`depth` must be a build-time constant",
    "QuantizeLinear": "`y_zero_point` must be 0",
    "RandomNormal": "seed is ignored",
    "RandomNormalLike": "seed is ignored",
    "RandomUniform": "seed is ignored",
    "RandomUniformLike": "seed is ignored",
    **{op: _REDUCE_AXES for op in _REDUCE_OPS},
    "Resize": "modes nearest/linear; aspect ratio policy stretch; no antialiasing",
    "RotaryEmbedding": "`position_ids` must be INT64",
    "STFT": "`frame_step` and `window` must be initializers; real-valued input",
    "ScatterND": "`reduction` must be none",
    "Squeeze": "`axes` must be resolvable to a constant",
    "TensorScatter": "`past_cache` and `update` must be 4-D; `axis` must be -2",
    "TopK": "`sorted` must be 1; K < 3840",
    "Unsqueeze": "`axes` must be resolvable to a constant",
    "GRU": "bidirectional: same activations both ways",
    "RNN": "bidirectional: same activations both ways",
}

# op -> (input index that must be a constant, what the table says). Checked where the input exists.
CONST_INPUTS: dict[str, tuple[int, str]] = {
    **{op: (1, _REDUCE_AXES) for op in _REDUCE_OPS},
    "CumSum": (1, "`axis` must be a build-time constant"),
    "OneHot": (1, "`depth` must be a build-time constant"),
    "TopK": (1, "`K` must be a build-time constant"),
    "Dropout": (2, "`training_mode` must be an initializer that evaluates to False"),
}

# Like CONST_INPUTS, but TensorRT 10.7+ also resolves some computed values: a note, not a problem.
SOFT_CONST_INPUTS: dict[str, tuple[int, str]] = {
    "Squeeze": (1, "`axes` must be resolvable to a constant"),
    "Unsqueeze": (1, "`axes` must be resolvable to a constant"),
}
BAD_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "Constant": ("sparse_value", "value_string", "value_strings")
}

# Which tensor carries the op's "Supported Types" (default: input 0).
TYPED_TENSOR: dict[str, tuple[str, int]] = {
    "Where": ("input", 1),
    "Constant": ("output", 0),
    "ConstantOfShape": ("output", 0),
    "RandomNormal": ("output", 0),
    "RandomUniform": ("output", 0),
}

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
DATA_DEPENDENT_SHAPE = frozenset({"NonZero", "NonMaxSuppression", "Unique", "Compress"})
