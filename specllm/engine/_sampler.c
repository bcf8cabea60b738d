/* The sampler chain of sampling.py for one float32 logit row, in one call, and the draw.

   After a model call, on the cold caches it leaves behind, the first numpy call of each kind costs
   tens of microseconds: a row's chain in numpy (a dozen calls for its top-k, twenty for the rest)
   costs about 300 us there, mostly code coming back into the caches. Here it is one call.

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

   The top-k reads the row as 16 interleaved slices of length m (group i: ids i, i + m, i + 2m,
   ...). The elementwise maximum of the slices gives each group's maximum in one pass over the
   row. Each of the k largest values lies in a group whose maximum is at least the k-th largest
   group maximum (were it not, k groups would each hold a larger value), and the same argument
   one level up gives a floor at most that: the k-th largest of the maxima's own 8 interleaved
   slices' maxima. Only the groups at or above the floor are read again, about k of them. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
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

/* maxima[i] = the largest of x[i], x[i + m], ..., x[i + (groups - 1) m]; NaN is passed over
   unless a whole group is NaN */
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

/* A buffer of items of `itemsize` bytes whose format is one of the characters of `formats`
   (native byte order), one-dimensional. */
static int buffer_of(PyObject *obj, Py_buffer *view, int flags, const char *formats, Py_ssize_t itemsize,
                     const char *what)
{
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == (PY_LITTLE_ENDIAN ? '<' : '>'))
        f++;
    if (strlen(f) != 1 || strchr(formats, f[0]) == NULL || view->itemsize != itemsize || view->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "%s must be one-dimensional, of format '%s' (%zd bytes), not '%s'",
                     what, formats, itemsize, f);
        PyBuffer_Release(view);
        return -1;
    }
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

static PyObject *py_candidates(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    double setting[3]; /* top_p, min_p, temperature */
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "candidates(row, ids, p, top_p, min_p, temperature) takes 6 arguments");
        return NULL;
    }
    for (int i = 0; i < 3; i++) {
        setting[i] = PyFloat_AsDouble(args[3 + i]);
        if (setting[i] == -1.0 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer row, ids, p;
    if (buffer_of(args[0], &row, 0, "f", sizeof(float), "the row") < 0)
        return NULL;
    if (buffer_of(args[1], &ids, PyBUF_WRITABLE, "nlq", sizeof(Py_ssize_t), "ids") < 0) {
        PyBuffer_Release(&row);
        return NULL;
    }
    if (buffer_of(args[2], &p, PyBUF_WRITABLE, "d", sizeof(double), "p") < 0) {
        PyBuffer_Release(&row);
        PyBuffer_Release(&ids);
        return NULL;
    }
    Py_ssize_t k = ids.len / (Py_ssize_t)sizeof(Py_ssize_t);
    PyObject *result = NULL;
    float values[MAX_K];
    Best best = {values, ids.buf, 0, k};
    if (!PyBuffer_IsContiguous(&ids, 'C') || !PyBuffer_IsContiguous(&p, 'C'))
        PyErr_SetString(PyExc_ValueError, "candidates: ids and p must be contiguous");
    else if (k < 1 || k > MAX_K || p.len / (Py_ssize_t)sizeof(double) != k)
        PyErr_Format(PyExc_ValueError, "candidates: ids and p must have the same length, 1 to %d", MAX_K);
    else if (!PyBuffer_IsContiguous(&row, 'C'))
        result = PyLong_FromSsize_t(-1);
    else {
        int failed;
        Py_ssize_t keep = -1;
        Py_BEGIN_ALLOW_THREADS
        failed = top_k(row.buf, row.len / (Py_ssize_t)sizeof(float), &best);
        if (!failed && best.count == k)
            keep = chain(values, k, setting[0], setting[1], setting[2], p.buf);
        Py_END_ALLOW_THREADS
        result = failed ? PyErr_NoMemory() : PyLong_FromSsize_t(keep);
    }
    PyBuffer_Release(&row);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&p);
    return result;
}

static PyObject *py_draw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "draw(p, u) takes 2 arguments");
        return NULL;
    }
    double u = PyFloat_AsDouble(args[1]);
    if (u == -1.0 && PyErr_Occurred())
        return NULL;
    Py_buffer p;
    if (buffer_of(args[0], &p, 0, "d", sizeof(double), "p") < 0)
        return NULL;
    Py_ssize_t n = p.len / (Py_ssize_t)sizeof(double);
    PyObject *result = NULL;
    if (n < 1)
        PyErr_SetString(PyExc_ValueError, "draw: p is empty");
    else if (!PyBuffer_IsContiguous(&p, 'C'))
        result = PyLong_FromSsize_t(-1);
    else {
        const double *q = p.buf;
        double cdf[MAX_K], total = 0.0, *sums = n <= MAX_K ? cdf : PyMem_Malloc((size_t)n * sizeof(double));
        if (sums == NULL)
            result = PyErr_NoMemory();
        else {
            for (Py_ssize_t j = 0; j < n; j++)
                sums[j] = total += q[j];
            double at = u * total;
            Py_ssize_t j = 0; /* the first running sum above `at`, as numpy's searchsorted(side="right") */
            while (j < n && sums[j] <= at)
                j++;
            result = PyLong_FromSsize_t(j < n ? j : n - 1);
            if (sums != cdf)
                PyMem_Free(sums);
        }
    }
    PyBuffer_Release(&p);
    return result;
}

static PyMethodDef methods[] = {
    {"candidates", (PyCFunction)(void (*)(void))py_candidates, METH_FASTCALL,
     "candidates(row, ids, p, top_p, min_p, temperature) -> keep: sampling.candidates (see _sampler.c)"},
    {"draw", (PyCFunction)(void (*)(void))py_draw, METH_FASTCALL, "draw(p, u) -> index: sampling.sample's draw"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sampler", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sampler(void)
{
    return PyModule_Create(&module);
}
