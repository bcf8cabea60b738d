/* The host's sampling work per row, in C: sampling.py's chain for one float32 logit row in one
   call, its draw, and the two steps verification takes on sparse distributions.

   After a model call, on the cold caches it leaves behind, the first numpy call of each kind costs
   tens of microseconds: a row's chain in numpy (a dozen calls for its top-k, twenty for the rest)
   costs 150-400 us there, mostly code coming back into the caches (benchmarks/sampled_row.py).
   Here it is one call.

   candidates(row, ids, p, top_p, min_p, temperature) -> keep
     row: one-dimensional float32 buffer (the logits); ids: writable intp buffer of k, 1 <= k <= 256
     (MAX_K), the top-k; p: writable float64 buffer of k.
     Writes the ids the chain keeps, by decreasing probability (the lowest ids first at a tie), and
     their probabilities, into the first `keep` entries: top-k -> top-p -> min-p on the raw
     logits, then temperature -> softmax over the survivors, as sampling.candidates does. Returns
     keep, or -1 with nothing written where numpy should do it: a strided row, or fewer than k
     values in it that are not NaN.
     The same ids and keep as numpy's; the probabilities agree to rounding (numpy's exp and its
     pairwise sums round differently in the last bit or two).

   draw(p, u) -> index
     p: one-dimensional float64 buffer, non-negative; u in [0, 1). The index where u times the
     total falls in p's running sum: sampling.sample's draw, with the same sums in the same order,
     so the very same index.

   by_id(ids, p, ids_out, p_out) -> n
     The (id, probability) pairs in ascending id order, as Sparse.of sorts them (stably); -1 with
     nothing written for more than MAX_K pairs.

   residual(p_ids, p, q_ids, q, ids_out, r_out, size) -> n
     max(0, p - q) over the ids either distribution holds (both ascending), q's ids at or past
     `size` left out: Sparse.minus, with the same subtractions, so the very same values. Writes
     the union's ids and those values (room for both inputs' lengths), and returns their number,
     or 0 where they hold no mass.

   top_probability(row, token, window, below) -> probability
     The raw softmax's probability of `token`, the row's maximum (a greedy draft's confidence):
     1 / the sum of exp(value - top) over the values within `window` (at most 20) of the top, as
     sampling.top_probability's numpy path, with a float32 exp of relative error about 2e-7
     (exp_approx, near_top_sum): auto only asks which of its confidence buckets it falls in. Where
     the probability is under `below` (> 0), some value under `below`, found from part of the row.
     -1.0 for a strided row.

   Each returns -1 with nothing written where an input is strided: numpy's path takes it.

   The top-k reads the row as 16 interleaved slices of length m (group i: ids i, i + m, i + 2m,
   ...). The elementwise maximum of the slices gives each group's maximum in one pass over the
   row. Each of the k largest values lies in a group whose maximum is at least the k-th largest
   group maximum (were it not, k groups would each hold a larger value), and the same argument
   one level up gives a floor at most that: the k-th largest of the maxima's own 8 interleaved
   slices' maxima. Only the groups at or above the floor are read again, about k of them. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define GROUPS 16
#define GROUPS_OF_MAXIMA 8
#define CHUNK 32 /* maxima kept in registers while every slice passes over them */
#define MAX_K 256

#if defined(_MSC_VER)
#define restrict __restrict
#endif

/* whether (v, id) comes before (w, id2): larger values first, then lower ids */
static inline int before(float v, Py_ssize_t id, float w, Py_ssize_t id2)
{
    return v > w || (v == w && id < id2);
}

/* The best k seen so far, in output order. */
typedef struct {
    float *values;
    Py_ssize_t *ids;
    Py_ssize_t count, k;
} Best;

static void offer(Best *best, float v, Py_ssize_t id)
{
    if (v != v) /* NaN */
        return;
    Py_ssize_t p;
    if (best->count < best->k)
        p = best->count++;
    else if (before(v, id, best->values[best->k - 1], best->ids[best->k - 1]))
        p = best->k - 1;
    else
        return;
    for (; p > 0 && before(v, id, best->values[p - 1], best->ids[p - 1]); p--) {
        best->values[p] = best->values[p - 1];
        best->ids[p] = best->ids[p - 1];
    }
    best->values[p] = v;
    best->ids[p] = id;
}

/* maxima[i] = the largest of x[i], x[i + m], ..., x[i + (groups - 1) m]. A NaN is passed over,
   but a group whose first value is NaN has the maximum NaN. */
static void slice_maxima(const float *restrict x, Py_ssize_t m, Py_ssize_t groups, float *restrict maxima)
{
    Py_ssize_t i0 = 0;
    for (; i0 + CHUNK <= m; i0 += CHUNK) {
        float acc[CHUNK];
        for (int i = 0; i < CHUNK; i++)
            acc[i] = x[i0 + i];
        for (Py_ssize_t g = 1; g < groups; g++) {
            const float *s = x + g * m + i0;
            for (int i = 0; i < CHUNK; i++)
                acc[i] = s[i] > acc[i] ? s[i] : acc[i];
        }
        for (int i = 0; i < CHUNK; i++)
            maxima[i0 + i] = acc[i];
    }
    for (Py_ssize_t i = i0; i < m; i++) {
        float v = x[i];
        for (Py_ssize_t g = 1; g < groups; g++)
            v = x[i + g * m] > v ? x[i + g * m] : v;
        maxima[i] = v;
    }
}

/* Offers every value of the groups whose maximum is at least the floor. A NaN maximum (a group
   that starts with NaN) fails the comparison, so such groups are read too, whatever the floor. */
static void offer_groups_from(Best *best, const float *x, Py_ssize_t m, const float *maxima, float floor)
{
    for (Py_ssize_t i0 = 0; i0 < m; i0 += CHUNK) {
        Py_ssize_t end = i0 + CHUNK < m ? i0 + CHUNK : m;
        int any = 0;
        for (Py_ssize_t i = i0; i < end; i++)
            any |= !(maxima[i] < floor);
        if (!any)
            continue;
        for (Py_ssize_t i = i0; i < end; i++)
            if (!(maxima[i] < floor))
                for (Py_ssize_t g = 0; g < GROUPS; g++)
                    offer(best, x[i + g * m], i + g * m);
    }
}

/* 0 on success, -1 (nothing written) when the scratch space cannot be had */
static int top_k(const float *x, Py_ssize_t n, Best *best)
{
    Py_ssize_t k = best->k, m = n / GROUPS;
    if (m <= k) {
        for (Py_ssize_t j = 0; j < n; j++)
            offer(best, x[j], j);
        return 0;
    }
    Py_ssize_t m2 = m / GROUPS_OF_MAXIMA;
    float *maxima = PyMem_RawMalloc((size_t)(m + m2) * sizeof(float));
    if (maxima == NULL)
        return -1;
    slice_maxima(x, m, GROUPS, maxima);
    const float *pool = maxima;
    Py_ssize_t pool_size = m;
    if (m2 > k) {
        slice_maxima(maxima, m2, GROUPS_OF_MAXIMA, maxima + m);
        pool = maxima + m;
        pool_size = m2;
    }
    for (Py_ssize_t j = 0; j < pool_size; j++)
        offer(best, pool[j], j);
    float floor = best->count == k ? best->values[k - 1] : -INFINITY;
    best->count = 0;
    offer_groups_from(best, x, m, maxima, floor);
    for (Py_ssize_t j = GROUPS * m; j < n; j++) /* the few ids past the last whole slice */
        offer(best, x[j], j);
    PyMem_RawFree(maxima);
    return 0;
}

/* top-p, min-p and temperature over the top-k (values by decreasing value), as
   sampling.candidates: returns keep, with the survivors' probabilities in p */
static Py_ssize_t chain(const float *values, Py_ssize_t k, double top_p, double min_p, double temperature, double *p)
{
    double x[MAX_K], total = 0.0;
    for (Py_ssize_t j = 0; j < k; j++) { /* the largest taken off first, as numpy's softmax does */
        x[j] = (double)values[j] - (double)values[0];
        p[j] = exp(x[j]);
        total += p[j];
    }
    for (Py_ssize_t j = 0; j < k; j++)
        p[j] /= total;
    Py_ssize_t keep = k;
    if (top_p < 1.0) { /* the shortest prefix whose mass reaches top_p */
        double mass = 0.0;
        for (keep = 0; keep < k; keep++) {
            mass += p[keep];
            if (mass >= top_p)
                break;
        }
        keep = keep < k ? keep + 1 : k;
    }
    if (min_p > 0.0) {
        double least = min_p * p[0];
        Py_ssize_t n = 0;
        for (Py_ssize_t j = 0; j < keep; j++)
            n += p[j] >= least;
        keep = n;
    }
    /* temperature last: it reshapes the survivors' probabilities. Dividing the shifted values
       keeps a tiny temperature finite at the top (0 / T) and sends the rest to -inf: probability 0 */
    total = 0.0;
    for (Py_ssize_t j = 0; j < keep; j++) {
        p[j] = exp(x[j] / temperature);
        total += p[j];
    }
    for (Py_ssize_t j = 0; j < keep; j++)
        p[j] /= total;
    return keep;
}

/* max(0, p - q) over the union of two distributions' ids (both ascending), in id order, q's ids
   at or past `size` left out: Sparse.minus. Returns the union's length, with its mass in `total`. */
static Py_ssize_t residual(const Py_ssize_t *p_ids, const double *p, Py_ssize_t np_, const Py_ssize_t *q_ids,
                           const double *q, Py_ssize_t nq, Py_ssize_t size, Py_ssize_t *ids, double *r, double *total)
{
    Py_ssize_t i = 0, j = 0, n = 0;
    while (nq > 0 && q_ids[nq - 1] >= size)
        nq--;
    *total = 0.0;
    while (i < np_ || j < nq) {
        Py_ssize_t id;
        double pv = 0.0, qv = 0.0;
        if (j >= nq || (i < np_ && p_ids[i] <= q_ids[j])) {
            id = p_ids[i];
            pv = p[i++];
            if (j < nq && q_ids[j] == id)
                qv = q[j++];
        } else {
            id = q_ids[j];
            qv = q[j++];
        }
        double d = pv - qv;
        ids[n] = id;
        r[n] = d < 0.0 ? 0.0 : d; /* numpy's maximum(d, 0.0), NaN kept */
        *total += r[n++];
    }
    return n;
}

/* ---- the Python functions ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    const char *formats; /* the format characters it takes (native byte order) */
    Py_ssize_t itemsize;
    int output; /* written to: must be writable and contiguous */
} Argument;

#define ROW {"the row", "f", sizeof(float), 0}
#define IDS(name, output) {name, "nlq", sizeof(Py_ssize_t), output}
#define PROBS(name, output) {name, "d", sizeof(double), output}

static void release(Py_buffer *views, int n)
{
    for (int i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
}

/* The one-dimensional buffers of args[0..n), as `arguments` describe them. Returns 1 where they
   are, 0 where an input is strided (nothing acquired: the caller declines, numpy's path takes
   it), -1 with an exception otherwise. */
static int buffers_of(PyObject *const *args, const Argument *arguments, int n, Py_buffer *views)
{
    int strided = 0;
    for (int i = 0; i < n; i++) {
        const Argument *a = &arguments[i];
        int flags = PyBUF_STRIDES | PyBUF_FORMAT | (a->output ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[i], &views[i], flags) < 0) {
            release(views, i);
            return -1;
        }
        const char *f = views[i].format ? views[i].format : "B";
        if (*f == '@' || *f == '=' || *f == (PY_LITTLE_ENDIAN ? '<' : '>'))
            f++;
        int contiguous = PyBuffer_IsContiguous(&views[i], 'C');
        if (strlen(f) != 1 || strchr(a->formats, f[0]) == NULL || views[i].itemsize != a->itemsize ||
            views[i].ndim != 1 || (a->output && !contiguous)) {
            PyErr_Format(PyExc_TypeError, "%s must be one-dimensional%s, of format '%s' (%zd bytes), not '%s'",
                         a->name, a->output ? " and contiguous" : "", a->formats, a->itemsize, f);
            release(views, i + 1);
            return -1;
        }
        strided |= !contiguous;
    }
    if (strided)
        release(views, n);
    return !strided;
}

static Py_ssize_t length(const Py_buffer *view)
{
    return view->len / view->itemsize;
}

static int doubles_of(PyObject *const *args, int n, double *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = PyFloat_AsDouble(args[i]);
        if (out[i] == -1.0 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

static int ssize_of(PyObject *arg, Py_ssize_t *out)
{
    *out = PyLong_AsSsize_t(arg);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int arguments_are(const char *signature, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, not %zd", signature, expected, nargs);
    return 0;
}

static PyObject *py_candidates(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Argument arguments[] = {ROW, IDS("ids", 1), PROBS("p", 1)};
    double setting[3]; /* top_p, min_p, temperature */
    Py_buffer v[3];
    (void)self;
    if (!arguments_are("candidates(row, ids, p, top_p, min_p, temperature)", nargs, 6) ||
        doubles_of(args + 3, 3, setting) < 0)
        return NULL;
    int got = buffers_of(args, arguments, 3, v);
    if (got <= 0)
        return got < 0 ? NULL : PyLong_FromLong(-1);
    Py_ssize_t k = length(&v[1]), keep = -1;
    PyObject *result = NULL;
    float values[MAX_K];
    Best best = {values, v[1].buf, 0, k};
    if (k < 1 || k > MAX_K || length(&v[2]) != k)
        PyErr_Format(PyExc_ValueError, "candidates: ids and p must have the same length, 1 to %d", MAX_K);
    else {
        int failed;
        Py_BEGIN_ALLOW_THREADS
        failed = top_k(v[0].buf, length(&v[0]), &best);
        if (!failed && best.count == k)
            keep = chain(values, k, setting[0], setting[1], setting[2], v[2].buf);
        Py_END_ALLOW_THREADS
        result = failed ? PyErr_NoMemory() : PyLong_FromSsize_t(keep);
    }
    release(v, 3);
    return result;
}

static PyObject *py_draw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Argument arguments[] = {PROBS("p", 0)};
    double u;
    Py_buffer v[1];
    (void)self;
    if (!arguments_are("draw(p, u)", nargs, 2) || doubles_of(args + 1, 1, &u) < 0)
        return NULL;
    int got = buffers_of(args, arguments, 1, v);
    if (got <= 0)
        return got < 0 ? NULL : PyLong_FromLong(-1);
    const double *p = v[0].buf;
    Py_ssize_t n = length(&v[0]), j = 0;
    double total = 0.0, sum = 0.0;
    for (Py_ssize_t i = 0; i < n; i++)
        total += p[i];
    double at = u * total;
    for (; j < n; j++) { /* the first running sum above `at`, as numpy's searchsorted(side="right") */
        sum += p[j];
        if (sum > at)
            break;
    }
    release(v, 1);
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "draw: p is empty");
        return NULL;
    }
    return PyLong_FromSsize_t(j < n ? j : n - 1);
}

static PyObject *py_by_id(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Argument arguments[] = {IDS("ids", 0), PROBS("p", 0), IDS("ids_out", 1), PROBS("p_out", 1)};
    Py_buffer v[4];
    (void)self;
    if (!arguments_are("by_id(ids, p, ids_out, p_out)", nargs, 4))
        return NULL;
    int got = buffers_of(args, arguments, 4, v);
    if (got <= 0)
        return got < 0 ? NULL : PyLong_FromLong(-1);
    Py_ssize_t n = length(&v[0]);
    PyObject *result = NULL;
    if (length(&v[1]) != n || length(&v[2]) != n || length(&v[3]) != n)
        PyErr_SetString(PyExc_ValueError, "by_id: ids, p and the outputs must have the same length");
    else if (n > MAX_K)
        result = PyLong_FromLong(-1); /* an insertion sort is for short rows */
    else {
        const Py_ssize_t *ids = v[0].buf;
        const double *p = v[1].buf;
        Py_ssize_t *ids_out = v[2].buf;
        double *p_out = v[3].buf;
        for (Py_ssize_t i = 0; i < n; i++) { /* stable, as numpy's argsort(kind="stable") */
            Py_ssize_t at = i;
            for (; at > 0 && ids_out[at - 1] > ids[i]; at--) {
                ids_out[at] = ids_out[at - 1];
                p_out[at] = p_out[at - 1];
            }
            ids_out[at] = ids[i];
            p_out[at] = p[i];
        }
        result = PyLong_FromSsize_t(n);
    }
    release(v, 4);
    return result;
}

static PyObject *py_residual(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Argument arguments[] = {IDS("p_ids", 0), PROBS("p", 0),      IDS("q_ids", 0),
                                         PROBS("q", 0),   IDS("ids_out", 1), PROBS("r_out", 1)};
    Py_buffer v[6];
    (void)self;
    Py_ssize_t size;
    if (!arguments_are("residual(p_ids, p, q_ids, q, ids_out, r_out, size)", nargs, 7) ||
        ssize_of(args[6], &size) < 0)
        return NULL;
    int got = buffers_of(args, arguments, 6, v);
    if (got <= 0)
        return got < 0 ? NULL : PyLong_FromLong(-1);
    Py_ssize_t np_ = length(&v[0]), nq = length(&v[2]);
    PyObject *result = NULL;
    if (length(&v[1]) != np_ || length(&v[3]) != nq || length(&v[4]) < np_ + nq || length(&v[5]) < np_ + nq)
        PyErr_SetString(PyExc_ValueError, "residual: ids and probabilities of the same lengths, room for both");
    else {
        double total;
        Py_ssize_t n = residual(v[0].buf, v[1].buf, np_, v[2].buf, v[3].buf, nq, size, v[4].buf, v[5].buf, &total);
        result = PyLong_FromSsize_t(total > 0.0 ? n : 0);
    }
    release(v, 6);
    return result;
}

/* e^d in float32 for d in [-20.5, 20.5] (clamped there, NaN to the low end), to about 2e-7: e^d
   = 2^n 2^f with n the nearest integer to d log2(e) and f in [-1/2, 1/2], 2^f by its Taylor
   series to the 6th power, 2^n added to the exponent's bits. Branch-free, so that a loop of it
   runs 4 or 8 lanes wide (setup.py compiles with -fno-trapping-math, without which gcc keeps its
   selects as branches and the loop scalar). */
static inline float exp_approx(float d)
{
    d = d >= -20.5f ? (d <= 20.5f ? d : 20.5f) : -20.5f;
    float t = d * 1.44269504f;
    int n = (int)(t + (t >= 0.0f ? 0.5f : -0.5f));
    float f = t - (float)n;
    float p = 1.0f + f * (0.693147181f + f * (0.240226507f + f * (0.0555041087f +
                     f * (0.00961812911f + f * (0.00133335581f + f * 0.000154035304f)))));
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (int32_t)((uint32_t)n << 23);
    memcpy(&p, &bits, sizeof p);
    return p;
}

/* whether a chunk of x holds a value at or above the floor */
static inline int any_at_least(const float *x, Py_ssize_t n, float floor)
{
    int any = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        any |= x[i] >= floor;
    return any;
}

/* The sum of exp(x - top) over the values of x at or above the floor: a block of the row at a
   time, its values near the top gathered first (branch-free, skipping the chunks that hold none),
   then exp_approx over them a chunk's lanes at a time. A real model's row holds from 0.1% to a
   third of its vocabulary there (a long tail of tiny probabilities), and libm's exp, one value at
   a time, would cost most of a millisecond for the latter. It stops after a block whose running
   sum passes `limit` (the caller then knows enough: the top's probability is below 1 / limit). */
#define BLOCK 4096
static double sum_of(const double *lanes)
{
    double total = 0.0;
    for (int i = 0; i < CHUNK; i++)
        total += lanes[i];
    return total;
}

static double near_top_sum(const float *x, Py_ssize_t n, float top, float floor, double limit)
{
    float near[BLOCK];
    double lanes[CHUNK] = {0}, total; /* a sum per lane: no chain of additions across the row */
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t block_end = b0 + BLOCK < n ? b0 + BLOCK : n, m = 0;
        for (Py_ssize_t i0 = b0; i0 < block_end; i0 += CHUNK) {
            Py_ssize_t end = i0 + CHUNK < block_end ? i0 + CHUNK : block_end;
            if (!any_at_least(x + i0, end - i0, floor))
                continue;
            for (Py_ssize_t i = i0; i < end; i++) {
                near[m] = x[i] - top; /* the float32 difference, as numpy's */
                m += x[i] >= floor;
            }
        }
        for (Py_ssize_t j0 = 0; j0 < m; j0 += CHUNK) {
            Py_ssize_t lanes_used = m - j0 < CHUNK ? m - j0 : CHUNK;
            for (Py_ssize_t i = 0; i < lanes_used; i++)
                lanes[i] += exp_approx(near[j0 + i]);
        }
        if (m && block_end < n && (total = sum_of(lanes)) > limit)
            return total;
    }
    return sum_of(lanes);
}

static PyObject *py_top_probability(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Argument arguments[] = {ROW};
    double window_and_below[2];
    Py_buffer v[1];
    (void)self;
    Py_ssize_t token;
    if (!arguments_are("top_probability(row, token, window, below)", nargs, 4) || ssize_of(args[1], &token) < 0 ||
        doubles_of(args + 2, 2, window_and_below) < 0)
        return NULL;
    double window = window_and_below[0], below = window_and_below[1];
    int got = buffers_of(args, arguments, 1, v);
    if (got <= 0)
        return got < 0 ? NULL : PyFloat_FromDouble(-1.0);
    const float *x = v[0].buf;
    Py_ssize_t n = length(&v[0]);
    if (token < 0 || token >= n) {
        release(v, 1);
        PyErr_SetString(PyExc_IndexError, "top_probability: token outside the row");
        return NULL;
    }
    float top = x[token], floor = top - (float)window; /* in float32, as numpy computes them */
    double total = near_top_sum(x, n, top, floor, below > 0.0 ? 1.0 / below : INFINITY);
    release(v, 1);
    return PyFloat_FromDouble(1.0 / total);
}

static PyMethodDef methods[] = {
    {"candidates", (PyCFunction)(void (*)(void))py_candidates, METH_FASTCALL,
     "candidates(row, ids, p, top_p, min_p, temperature) -> keep: sampling.candidates (see _sampler.c)"},
    {"draw", (PyCFunction)(void (*)(void))py_draw, METH_FASTCALL, "draw(p, u) -> index: sampling.sample's draw"},
    {"by_id", (PyCFunction)(void (*)(void))py_by_id, METH_FASTCALL,
     "by_id(ids, p, ids_out, p_out) -> n: the pairs in ascending id order (Sparse.of)"},
    {"residual", (PyCFunction)(void (*)(void))py_residual, METH_FASTCALL,
     "residual(p_ids, p, q_ids, q, ids_out, r_out, size) -> n: max(0, p - q) (Sparse.minus)"},
    {"top_probability", (PyCFunction)(void (*)(void))py_top_probability, METH_FASTCALL,
     "top_probability(row, token, window) -> probability: a greedy draft's confidence"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sampler", NULL, -1, methods, NULL, NULL, NULL, NULL};

#ifndef SOURCE_SHA256
#define SOURCE_SHA256 "unknown" /* setup.py defines it */
#endif

PyMODINIT_FUNC PyInit__sampler(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_SHA256", SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
