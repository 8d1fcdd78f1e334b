// SeededDropout's kernels (ms_accum/core/dropout.py), loaded by MindSpore's ops.Custom(func_type="aot") on CPU.
//
// out = x * mask / keep_prob, the mask a pure function of (seed, offset, position): the backward calls the same
// arithmetic on the output's gradient with the offset the forward used, so no mask is ever stored. SplitMix64 gives
// word i the value splitmix64(seed + (offset + 1 + i) * golden); a tensor of n values takes ceil(n / 4) words, value
// k * words + i reading the k-th 16-bit lane of word i from the top, kept when that lane is below `threshold`
// (keep_prob * 2^16).
//
// Each dropout op has a slot: its seed, its offset (the words drawn so far), threshold and scale. The forward
// kernel is called as MindSpore's Dropout primitive is, with x alone, so the slot is chosen by the entry point
// (SeededDropout0, SeededDropout1, ..., one per slot); it outputs the offset it drew from beside the output (in the
// place of the primitive's mask, which nn.Dropout drops) and advances the slot. Python reads and sets the slots
// (ms_accum_slot_*) to save and resume them.
#include <atomic>
#include <cstdint>
#include <cstring>

namespace {
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr int kSlots = 1024;

struct Slot {
  int64_t seed = 0;
  std::atomic<int64_t> offset{0};
  int64_t threshold = 65536;
  double scale = 1.0;
};
Slot g_slots[kSlots];

inline uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// IEEE half and bfloat16 <-> float, for the values this kernel scales.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = mantissa;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400) == 0);
    bits = sign | ((112 - e) << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToHalf(float f) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) return sign | 0x7C00u | (magnitude > 0x7F800000u ? 0x200u : 0u);
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;  // rounds past the largest half
  if (magnitude < 0x38800000u) {                       // subnormal half (or zero)
    const uint32_t shift = 113 - (magnitude >> 23);
    if (shift > 24) return sign;
    const uint32_t m = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t half = m >> (shift + 13), rest = m & ((1u << (shift + 13)) - 1), mid = 1u << (shift + 12);
    return sign | (half + (rest > mid || (rest == mid && (half & 1))));
  }
  const uint32_t rounded = magnitude - 0x38000000u + 0xFFFu + ((magnitude >> 13) & 1);
  return sign | (rounded >> 13);
}

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1)) >> 16);
}

template <typename Load, typename Store>
void Apply(int64_t size, uint64_t seed, uint64_t offset, uint64_t threshold, Load load, Store store) {
  const int64_t words = (size + 3) / 4;
  for (int64_t i = 0; i < words; ++i) {
    const uint64_t word = SplitMix64(seed + (offset + 1 + static_cast<uint64_t>(i)) * kGolden);
    for (int64_t k = 0, j = i; k < 4 && j < size; ++k, j += words) {
      store(j, ((word >> (48 - 16 * k)) & 0xFFFF) < threshold, load(j));
    }
  }
}

// out = x * mask * scale for x of `dtype`; returns false for a dtype it does not serve.
bool Dropout(const char *dtype, const void *in, void *out, int64_t size, uint64_t seed, uint64_t offset,
             uint64_t threshold, double scale) {
  if (std::strcmp(dtype, "float32") == 0) {
    const float *x = static_cast<const float *>(in);
    float *y = static_cast<float *>(out);
    const float s = static_cast<float>(scale);
    Apply(size, seed, offset, threshold, [x](int64_t j) { return x[j]; },
          [y, s](int64_t j, bool keep, float v) { y[j] = keep ? v * s : 0.0f; });
  } else if (std::strcmp(dtype, "float64") == 0) {
    const double *x = static_cast<const double *>(in);
    double *y = static_cast<double *>(out);
    Apply(size, seed, offset, threshold, [x](int64_t j) { return x[j]; },
          [y, scale](int64_t j, bool keep, double v) { y[j] = keep ? v * scale : 0.0; });
  } else if (std::strcmp(dtype, "float16") == 0 || std::strcmp(dtype, "bfloat16") == 0) {
    const bool half = dtype[1] == 'l';  // "float16"
    const uint16_t *x = static_cast<const uint16_t *>(in);
    uint16_t *y = static_cast<uint16_t *>(out);
    const float s = static_cast<float>(scale);
    Apply(size, seed, offset, threshold, [x, half](int64_t j) { return half ? HalfToFloat(x[j]) : Bf16ToFloat(x[j]); },
          [y, s, half](int64_t j, bool keep, float v) {
            y[j] = keep ? (half ? FloatToHalf(v * s) : FloatToBf16(v * s)) : 0;
          });
  } else {
    return false;
  }
  return true;
}

int64_t Size(int ndim, const int64_t *shape) {
  int64_t size = 1;
  for (int d = 0; d < ndim; ++d) size *= shape[d];
  return size;
}

// Forward of slot `slot`: params are x, then the outputs out and the offset drawn from (an int64 scalar).
int Forward(int slot, int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam != 3) return 1;
  const int64_t size = Size(ndims[0], shapes[0]);
  Slot &s = g_slots[slot];
  const int64_t offset = s.offset.fetch_add((size + 3) / 4);
  *static_cast<int64_t *>(params[2]) = offset;
  return Dropout(dtypes[0], params[0], params[1], size, static_cast<uint64_t>(s.seed), static_cast<uint64_t>(offset),
                 static_cast<uint64_t>(s.threshold), s.scale) ? 0 : 1;
}
}  // namespace

// Backward: params are the output's gradient, the slot, the offset the forward drew from (int64 scalars), then dx.
extern "C" int SeededDropoutGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  (void)stream;
  (void)extra;
  if (nparam != 4) return 1;
  const int64_t slot = *static_cast<const int64_t *>(params[1]);
  if (slot < 0 || slot >= kSlots) return 1;
  const Slot &s = g_slots[slot];
  const int64_t offset = *static_cast<const int64_t *>(params[2]);
  return Dropout(dtypes[0], params[0], params[3], Size(ndims[0], shapes[0]), static_cast<uint64_t>(s.seed),
                 static_cast<uint64_t>(offset), static_cast<uint64_t>(s.threshold), s.scale) ? 0 : 1;
}

extern "C" int ms_accum_slots() { return kSlots; }

extern "C" void ms_accum_slot_set(int slot, int64_t seed, int64_t offset, int64_t threshold, double scale) {
  Slot &s = g_slots[slot];
  s.seed = seed;
  s.offset.store(offset);
  s.threshold = threshold;
  s.scale = scale;
}

extern "C" int64_t ms_accum_slot_offset(int slot) { return g_slots[slot].offset.load(); }

#define MS_ACCUM_ENTRY(N)                                                                                 \
  extern "C" int SeededDropout##N(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, \
                                  void *stream, void *extra) {                                            \
    (void)stream;                                                                                         \
    (void)extra;                                                                                          \
    return Forward(N, nparam, params, ndims, shapes, dtypes);                                             \
  }
// The entry points, MS_ACCUM_ENTRY(0) to MS_ACCUM_ENTRY(kSlots - 1), follow: ms_accum.core.native appends them.
