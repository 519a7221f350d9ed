/* compare_out.c: -m compare's rows as files (see compare.h): the SVG plot
 * of bits per value against KL, CSV and JSON.
 *
 * Data flow: compare_run -> rows -> compare_write (run.c's -o FILE): the
 * format from the name's extension, the bytes into a temporary file beside
 * the target, renamed over it once closed without error (rename within a
 * folder is atomic: readers see the old file or the whole new one).
 * Formats: RFC 4180 (CSV), RFC 8259 (JSON), SVG 1.1 (XML 1.0: markup
 * escaped, valid UTF-8, no control characters). Labels follow the usual
 * greedy point-feature placement: candidate places around each point,
 * nearest first, the first that collides with nothing wins; crowded points
 * choose first, and labels set apart get a leader line.
 */
#include "eval/compare.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Page and frame, SVG user units (px). */
#define SVG_W 720.0
#define SVG_H 480.0
#define FONT 12.0
/* Between the lowest decade and the KL-0 axis, when a row has KL 0. */
#define ZERO_STRIP 36.0
/* A label box's extent around its text: from the baseline up 11 px (capitals
 * and ascenders at 12 px, plus the white halo) and down 4 (descenders). */
#define BOX_PAD 2.0
#define BOX_UP 11.0
#define BOX_H 15.0

/* The numeric fields, in CompareRow's order, as CSV and JSON name them. */
static const struct {
    const char *name;
    size_t off;
} NUMS[] = {
    {"k_bits", offsetof(CompareRow, k_bits)},   {"v_bits", offsetof(CompareRow, v_bits)},
    {"bytes_per_token", offsetof(CompareRow, bytes_per_token)},
    {"ratio_f16", offsetof(CompareRow, ratio_f16)}, {"ppl", offsetof(CompareRow, ppl)},
    {"dppl_pct", offsetof(CompareRow, dppl_pct)}, {"kl", offsetof(CompareRow, kl)},
    {"top1", offsetof(CompareRow, top1)},       {"greedy", offsetof(CompareRow, greedy)},
    {"decode_tps", offsetof(CompareRow, decode_tps)},
};
#define N_NUMS (sizeof NUMS / sizeof NUMS[0])

static double row_num(const CompareRow *r, size_t j) { return *(const double *)((const char *)r + NUMS[j].off); }

/* ---- text ---- */

/* Length of the valid UTF-8 character at s[0 .. n) (n > 0), or 0 where it
 * is not one: overlongs, surrogates, and U+FFFE/U+FFFF (not XML
 * characters) count as invalid. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    static const unsigned lowest[5] = {0, 0, 0x80, 0x800, 0x10000};
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!len || len > n) return 0;
    unsigned cp = c & (0x7Fu >> len);
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3F);
    }
    if (cp < lowest[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0xFFFE || cp == 0xFFFF) return 0;
    return len;
}

typedef enum { ESC_XML, ESC_JSON } Escape;

/* s[0 .. n) as XML character data (also fit for attribute values) or a
 * JSON string's body. Bytes that are not UTF-8 become U+FFFD, as do control
 * characters in XML (1.0 cannot write them at all); JSON gets \u00NN. */
static void put_text(FILE *f, const char *s, size_t n, Escape e) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t len = utf8_char(u + i, n - i);
        if (!len || (e == ESC_XML && c < 0x20)) fputs("\xEF\xBF\xBD", f);
        else if (e == ESC_JSON && c < 0x20) fprintf(f, "\\u%04x", c);
        else if (e == ESC_JSON && (c == '"' || c == '\\')) fprintf(f, "\\%c", c);
        else if (e == ESC_XML && strchr("&<>\"'", (int)c))
            fputs(c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&quot;" : "&#39;", f);
        else fwrite(u + i, 1, len, f);
        i += len ? len : 1;
    }
}

/* The last component of a path ("models/qwen3-kjv-mtp/" -> its folder's
 * name, "/" itself for the root), as a pointer into it and a length. */
static const char *last_component(const char *path, size_t *len) {
    if (!path) path = "";
    size_t end = strlen(path);
    while (end > 1 && path[end - 1] == '/') end--;
    size_t start = end;
    while (start > 0 && path[start - 1] != '/') start--;
    /* only the root's slash was left */
    if (start == end && end > 0) start--;
    *len = end - start;
    return path + start;
}

/* x in the shortest %g form that strtod reads back as x; NaN and the
 * infinities as strtod's nan/inf, or (json) null. */
static void put_num(FILE *f, double x, int json) {
    if (!isfinite(x)) {
        fputs(json ? "null" : isnan(x) ? "nan" : x > 0 ? "inf" : "-inf", f);
        return;
    }
    char b[32];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(b, sizeof b, "%.*g", digits, x);
        if (strtod(b, NULL) == x) break;
    }
    fputs(b, f);
}

/* ---- CSV and JSON ---- */

/* One CSV field: quoted, inner quotes doubled, only where it holds a comma,
 * a quote or a line break (RFC 4180, 2.6-2.7). */
static void put_csv_field(FILE *f, const char *s, size_t n) {
    if (!memchr(s, ',', n) && !memchr(s, '"', n) && !memchr(s, '\n', n) && !memchr(s, '\r', n)) {
        fwrite(s, 1, n, f);
        return;
    }
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"') fputc('"', f);
        fputc(s[i], f);
    }
    fputc('"', f);
}

static void write_csv(FILE *f, const CompareRow *r, int n) {
    fputs("name,weights", f);
    for (size_t j = 0; j < N_NUMS; j++) fprintf(f, ",%s", NUMS[j].name);
    fputc('\n', f);
    for (int i = 0; i < n; i++) {
        put_csv_field(f, r[i].name, strnlen(r[i].name, sizeof r[i].name));
        fputc(',', f);
        put_csv_field(f, r[i].weights, strlen(r[i].weights));
        for (size_t j = 0; j < N_NUMS; j++) {
            fputc(',', f);
            put_num(f, row_num(&r[i], j), 0);
        }
        fputc('\n', f);
    }
}

static void write_json(FILE *f, const CompareRow *r, int n, const char *title) {
    size_t tl;
    const char *t = last_component(title, &tl);
    fputs("{\n  \"title\": \"", f);
    put_text(f, t, tl, ESC_JSON);
    fputs("\",\n  \"rows\": [", f);
    for (int i = 0; i < n; i++) {
        fputs(i ? ",\n    {\"name\": \"" : "\n    {\"name\": \"", f);
        put_text(f, r[i].name, strnlen(r[i].name, sizeof r[i].name), ESC_JSON);
        fputs("\", \"weights\": \"", f);
        put_text(f, r[i].weights, strlen(r[i].weights), ESC_JSON);
        fputc('"', f);
        for (size_t j = 0; j < N_NUMS; j++) {
            fprintf(f, ", \"%s\": ", NUMS[j].name);
            put_num(f, row_num(&r[i], j), 1);
        }
        fputc('}', f);
    }
    fputs(n ? "\n  ]\n}\n" : "]\n}\n", f);
}

/* ---- plot layout ---- */

/* A label's advance in px, estimated from DejaVu Sans's widths by class of
 * character (the widest of the usual sans-serif fonts: Liberation, Arial
 * and Helvetica are narrower), so boxes err large. A character beyond
 * ASCII, or a control character (drawn as U+FFFD), counts a full em. */
static double text_width(const char *s) {
    double em = 0;
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        int c = *u;
        if ((c & 0xC0) == 0x80) continue;
        em += c >= 0x80 || c < 0x20 || strchr("mwMW%@", c) ? 1.0
              : strchr("ijl.,:;|' ", c)         ? 0.34
              : strchr("frt()[]{}/\\-\"!`", c)  ? 0.47
              : strchr("=+<>#~&^*", c)          ? 0.84
              : c >= 'A' && c <= 'Z'             ? 0.8
                                                 : 0.66;
    }
    return em * FONT;
}

static double box_overlap(CompareBox a, CompareBox b) {
    double w = fmin(a.x + a.w, b.x + b.w) - fmax(a.x, b.x), h = fmin(a.y + a.h, b.y + b.h) - fmax(a.y, b.y);
    return w > 0 && h > 0 ? w * h : 0;
}

/* Distance from (x, y) to box b, 0 inside it. */
static double box_dist(CompareBox b, double x, double y) {
    double dx = fmax(fmax(b.x - x, x - (b.x + b.w)), 0), dy = fmax(fmax(b.y - y, y - (b.y + b.h)), 0);
    return hypot(dx, dy);
}

typedef struct {
    double x0, y0, x1, y1;
} Seg;

/* Whether segment s passes through box b (Liang-Barsky clipping). */
static int seg_hits_box(Seg s, CompareBox b) {
    double dx = s.x1 - s.x0, dy = s.y1 - s.y0, t0 = 0, t1 = 1;
    double p[4] = {-dx, dx, -dy, dy}, q[4] = {s.x0 - b.x, b.x + b.w - s.x0, s.y0 - b.y, b.y + b.h - s.y0};
    for (int i = 0; i < 4; i++) {
        if (p[i] == 0) {
            if (q[i] < 0) return 0;
            continue;
        }
        double t = q[i] / p[i];
        if (p[i] < 0) t0 = fmax(t0, t);
        else t1 = fmin(t1, t);
        if (t0 > t1) return 0;
    }
    return 1;
}

/* Distance from (x, y) to segment s. */
static double seg_dist(Seg s, double x, double y) {
    double dx = s.x1 - s.x0, dy = s.y1 - s.y0, dd = dx * dx + dy * dy;
    double t = dd > 0 ? fmin(fmax(((x - s.x0) * dx + (y - s.y0) * dy) / dd, 0), 1) : 0;
    return hypot(s.x0 + t * dx - x, s.y0 + t * dy - y);
}

static double turn(double ax, double ay, double bx, double by, double cx, double cy) {
    return (bx - ax) * (cy - ay) - (by - ay) * (cx - ax);
}

/* Whether two segments cross (touching ends do not count). */
static int segs_cross(Seg a, Seg b) {
    return turn(a.x0, a.y0, a.x1, a.y1, b.x0, b.y0) * turn(a.x0, a.y0, a.x1, a.y1, b.x1, b.y1) < 0 &&
           turn(b.x0, b.y0, b.x1, b.y1, a.x0, a.y0) * turn(b.x0, b.y0, b.x1, b.y1, a.x1, a.y1) < 0;
}

/* The leader from a point's dot to the nearest point of its label box. */
static Seg leader_of(const CompareLabel *l) {
    double qx = fmin(fmax(l->px, l->box.x), l->box.x + l->box.w), qy = fmin(fmax(l->py, l->box.y), l->box.y + l->box.h);
    double d = hypot(qx - l->px, qy - l->py), k = d > 0 ? COMPARE_DOT / d : 0;
    return (Seg){l->px + (qx - l->px) * k, l->py + (qy - l->py) * k, qx, qy};
}

/* What a label placed as c costs against the points and the labels placed
 * so far (all[placed[0 .. np)]): overlapping area of boxes, plus a fixed
 * 100 (about half a short label's area) for each dot, leader or box it
 * hits, and for each other dot that a label without a leader sits about as
 * near to as to its own (in a cluster it would read as that dot's). 0: free. */
static double place_cost(const CompareLabel *c, const CompareLabel *all, int n, const int *placed, int np) {
    double cost = 0, own = box_dist(c->box, c->px, c->py);
    Seg s = leader_of(c);
    for (int k = 0; k < n; k++) {
        if (!all[k].shown) continue;
        double d = box_dist(c->box, all[k].px, all[k].py);
        if (d < COMPARE_DOT + 1) cost += 100;
        /* a dot on top of this one is no help to tell apart either way */
        if (all[k].px == c->px && all[k].py == c->py) continue;
        if (!c->leader && d < own + 16) cost += 100;
        if (c->leader && seg_dist(s, all[k].px, all[k].py) < COMPARE_DOT + 1) cost += 100;
    }
    for (int k = 0; k < np; k++) {
        const CompareLabel *o = &all[placed[k]];
        Seg t = leader_of(o);
        cost += box_overlap(c->box, o->box);
        if (c->leader && seg_hits_box(s, o->box)) cost += 100;
        if (o->leader && seg_hits_box(t, c->box)) cost += 100;
        if (c->leader && o->leader && segs_cross(s, t)) cost += 100;
    }
    return cost;
}

/* Places l's label: the first free candidate, else the cheapest. Rings of
 * growing distance from the dot (the first touching it, the others with a
 * leader), 16 directions each, right of the point first. */
static void place_label(CompareLabel *l, const CompareBox *area, const CompareLabel *all, int n, const int *placed,
                        int np) {
    static const double ring[] = {0, 8, 18, 30, 46, 66, 92, 124, 160};
    static const double dir[] = {0,    45,    -45,   180,  135,   -135, 90,   -90,
                                 22.5, -22.5, 157.5, -157.5, 67.5, -67.5, 112.5, -112.5};
    double w = text_width(l->text) + 2 * BOX_PAD, best = INFINITY;
    CompareLabel c = *l;
    for (size_t ri = 0; ri < sizeof ring / sizeof ring[0] && best > 0; ri++)
        for (size_t di = 0; di < sizeof dir / sizeof dir[0] && best > 0; di++) {
            /* the box's nearest side or corner at this distance and angle
             * (y grows downward: a positive angle goes up) */
            double a = dir[di] * M_PI / 180, cx = cos(a), cy = -sin(a), d = COMPARE_DOT + 2 + ring[ri];
            double ax = l->px + d * cx, ay = l->py + d * cy;
            c.box = (CompareBox){cx > 0.3 ? ax : cx < -0.3 ? ax - w : ax - w / 2,
                                 cy > 0.3 ? ay : cy < -0.3 ? ay - BOX_H : ay - BOX_H / 2, w, BOX_H};
            c.leader = ri > 0;
            if (c.box.x < area->x || c.box.y < area->y || c.box.x + w > area->x + area->w ||
                c.box.y + BOX_H > area->y + area->h)
                continue;
            double cost = place_cost(&c, all, n, placed, np);
            if (cost < best) best = cost, *l = c;
        }
    /* a frame too small for the label: at the point, whatever it covers */
    if (best == INFINITY) l->box = (CompareBox){l->px + COMPARE_DOT + 2, l->py - BOX_H / 2, w, BOX_H}, l->leader = 0;
    /* the text hugs the point's side of its box: the box's width is an
     * estimate, most fonts end short of it */
    l->anchor = l->box.x >= l->px ? 0 : l->box.x + w <= l->px ? 2 : 1;
    l->tx = l->anchor == 0 ? l->box.x + BOX_PAD : l->anchor == 2 ? l->box.x + w - BOX_PAD : l->box.x + w / 2;
    l->ty = l->box.y + BOX_UP;
}

/* log10 of the nearest of 1, 2, 5 times a power of ten at or below v (up:
 * at or above it). */
static double tick125(double v, int up) {
    static const double m[] = {1, 2, 5, 10};
    double e = floor(log10(v)), f = v / pow(10, e);
    int i = up ? 0 : 3;
    /* log10 may land a hair off a power of ten: f then sits just past 1 or 10 */
    if (up) while (i < 3 && m[i] < f * (1 - 1e-12)) i++;
    else while (i > 0 && m[i] > f * (1 + 1e-12)) i--;
    return e + log10(m[i]);
}

int compare_layout(const CompareRow *r, int n, ComparePlot *p, CompareLabel *lab) {
    /* order[]: the points in placing order, those placed so far first;
     * near[]: each point's count of others within 40 px */
    int *order = malloc((size_t)(n > 0 ? 2 * n : 1) * sizeof(int)), *near = order + n, no = 0;
    if (!order) return -1;
    double bmin = INFINITY, bmax = 0, kmin = INFINITY, kmax = 0;
    p->has_zero = 0;
    for (int i = 0; i < n; i++) {
        CompareLabel *l = &lab[i];
        double b = (r[i].k_bits + r[i].v_bits) / 2;
        memset(l, 0, sizeof *l);
        l->shown = b > 0 && b <= 1e6 && fabs(r[i].kl) <= 1e6;
        if (!l->shown) continue;
        bmin = fmin(bmin, b), bmax = fmax(bmax, b);
        if (r[i].kl > 0) kmin = fmin(kmin, r[i].kl), kmax = fmax(kmax, r[i].kl);
        else l->at_zero = p->has_zero = 1;
    }
    if (bmin > bmax) bmin = 2, bmax = 32;
    if (kmin > kmax) kmin = 1e-6, kmax = 1e-2;
    p->area = (CompareBox){80, 40, SVG_W - 120, SVG_H - 110};
    /* bits from a 1-2-5 tick to one (the points spread wider than between
     * decades), KL in whole decades; a point exactly on a tick is kept off
     * the right and top edges, where its label would have room on one side
     * only */
    p->lb0 = tick125(bmin, 0), p->lb1 = tick125(bmax * 1.01, 1);
    p->lk0 = floor(log10(kmin)), p->lk1 = ceil(log10(kmax * 1.01));
    p->y_log0 = p->area.y + p->area.h - (p->has_zero ? ZERO_STRIP : 0);
    const CompareBox *a = &p->area;
    for (int i = 0; i < n; i++) {
        CompareLabel *l = &lab[i];
        if (!l->shown) continue;
        double b = (r[i].k_bits + r[i].v_bits) / 2;
        l->px = a->x + (log10(b) - p->lb0) / (p->lb1 - p->lb0) * a->w;
        l->py = l->at_zero ? a->y + a->h : a->y + (p->lk1 - log10(r[i].kl)) / (p->lk1 - p->lk0) * (p->y_log0 - a->y);
        int stored = !strcmp(r[i].weights, "stored");
        int len = snprintf(l->text, sizeof l->text, "%.*s%s%s", (int)strnlen(r[i].name, sizeof r[i].name), r[i].name,
                           stored ? "" : ", weights ", stored ? "" : r[i].weights);
        /* a zero KL has no place on a log scale: its value goes in words */
        if (l->at_zero && len >= 0 && (size_t)len < sizeof l->text)
            snprintf(l->text + len, sizeof l->text - len, r[i].kl == 0 ? ", KL 0" : ", KL %.2g", r[i].kl);
    }
    /* crowded points choose first */
    for (int i = 0; i < n; i++) {
        if (!lab[i].shown) continue;
        near[i] = 0;
        for (int k = 0; k < n; k++)
            if (k != i && lab[k].shown && hypot(lab[k].px - lab[i].px, lab[k].py - lab[i].py) < 40) near[i]++;
        order[no++] = i;
    }
    for (int i = 1; i < no; i++)
        for (int k = i; k > 0 && near[order[k]] > near[order[k - 1]]; k--) {
            int t = order[k];
            order[k] = order[k - 1], order[k - 1] = t;
        }
    for (int i = 0; i < no; i++) place_label(&lab[order[i]], a, lab, n, order, i);
    free(order);
    return 0;
}

/* ---- SVG ---- */

/* Decade lines of one axis every step decades, so that no more than about
 * ten carry labels. */
static int decade_step(double lo, double hi) { return (int)ceil((hi - lo) / 10); }

static void write_svg(FILE *f, int n, const char *title, const ComparePlot *p, const CompareLabel *lab) {
    static const char *anchors[] = {"start", "middle", "end"};
    const CompareBox *a = &p->area;
    const double bottom = a->y + a->h;
    size_t tl;
    const char *t = last_component(title, &tl);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"%.0f\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", SVG_W, SVG_H, FONT);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">", SVG_W / 2);
    put_text(f, t, tl, ESC_XML);
    fprintf(f, "</text>\n<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#444\"/>\n",
            a->x, a->y, a->w, a->h);
    /* bits: decades, plus 2 and 5 while there are few of them */
    int bstep = decade_step(p->lb0, p->lb1);
    for (double e = floor(p->lb0); e <= p->lb1; e += bstep)
        for (int m = 1; m <= 5; m += m == 1 ? 1 : 3) {
            double b = m * pow(10, e), x = a->x + (log10(b) - p->lb0) / (p->lb1 - p->lb0) * a->w;
            if (x < a->x - 0.5 || x > a->x + a->w + 0.5 || (m > 1 && p->lb1 - p->lb0 > 3)) continue;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#ddd\"/>\n", x, a->y, x, bottom);
            fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%g</text>\n", x, bottom + 16, b);
        }
    /* KL: decades, plus 2 and 5 (fainter) while there are few of them */
    int kstep = decade_step(p->lk0, p->lk1);
    for (double e = p->lk0; e <= p->lk1; e += kstep)
        for (int m = 1; m <= 5; m += m == 1 ? 1 : 3) {
            double y = a->y + (p->lk1 - e - log10(m)) / (p->lk1 - p->lk0) * (p->y_log0 - a->y);
            if (y < a->y - 0.5 || (m > 1 && p->lk1 - p->lk0 > 3)) continue;
            fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"%s\"/>\n", a->x, y,
                    a->x + a->w, y, m > 1 ? "#eee" : "#ddd");
            fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%de%.0f</text>\n", a->x - 6, y + 4, m, e);
        }
    /* KL 0 is the bottom edge, below a break in the KL axis */
    if (p->has_zero) {
        double yb = (p->y_log0 + bottom) / 2;
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">0</text>\n", a->x - 6, bottom + 4);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"10\" height=\"6\" fill=\"white\"/>\n", a->x - 5, yb - 3);
        fprintf(f, "<path d=\"M%.0f %.1fl10 -4M%.0f %.1fl10 -4\" stroke=\"#444\"/>\n", a->x - 5, yb - 1, a->x - 5,
                yb + 5);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">bits per value (mean of K and V, log scale)"
               "</text>\n", a->x + a->w / 2, SVG_H - 30);
    fprintf(f, "<text transform=\"translate(18 %.0f) rotate(-90)\" text-anchor=\"middle\">mean KL vs f32 (nats, log "
               "scale)</text>\n", a->y + a->h / 2);
    /* leaders under the dots, dots rimmed so that close ones stay apart,
     * labels on a white halo over the grid */
    for (int i = 0; i < n; i++) {
        if (!lab[i].shown || !lab[i].leader) continue;
        Seg s = leader_of(&lab[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\"/>\n", s.x0, s.y0, s.x1, s.y1);
    }
    for (int i = 0; i < n; i++)
        if (lab[i].shown)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.0f\" fill=\"#c33\" stroke=\"white\"/>\n", lab[i].px,
                    lab[i].py, COMPARE_DOT);
    for (int i = 0; i < n; i++) {
        if (!lab[i].shown) continue;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" stroke=\"white\" stroke-width=\"3\" "
                   "paint-order=\"stroke\">", lab[i].tx, lab[i].ty, anchors[lab[i].anchor]);
        put_text(f, lab[i].text, strlen(lab[i].text), ESC_XML);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
}

/* ---- files ---- */

int compare_format(const char *path, char *err, size_t errlen) {
    /* a dot in a folder's name leaves a '/' in what follows it */
    const char *dot = strrchr(path, '.');
    if (dot) {
        if (!strcasecmp(dot, ".svg")) return COMPARE_SVG;
        if (!strcasecmp(dot, ".csv")) return COMPARE_CSV;
        if (!strcasecmp(dot, ".json")) return COMPARE_JSON;
    }
    snprintf(err, errlen, "%s: unknown output format: expected a name ending in .svg, .csv or .json", path);
    return -1;
}

/* Writes fmt to "PATH.PID.tmp" (created new, so never someone else's file),
 * then renames it over path; on any failure removes it. */
static int write_file(const char *path, CompareFormat fmt, const CompareRow *r, int n, const char *title, char *err,
                      size_t errlen) {
    ComparePlot plot;
    CompareLabel *lab = NULL;
    if (fmt == COMPARE_SVG &&
        (!(lab = malloc((size_t)(n > 0 ? n : 1) * sizeof *lab)) || compare_layout(r, n, &plot, lab))) {
        free(lab);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    char tmp[4096];
    int fd = -1;
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid()) >= sizeof tmp) errno = ENAMETOOLONG;
    else fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        if (fd >= 0) close(fd), unlink(tmp);
        free(lab);
        return -1;
    }
    errno = 0;
    if (fmt == COMPARE_SVG) write_svg(f, n, title, &plot, lab);
    else if (fmt == COMPARE_CSV) write_csv(f, r, n);
    else write_json(f, r, n, title);
    free(lab);
    /* stdio keeps the first write error; close flushes the rest */
    int e = ferror(f) ? (errno ? errno : EIO) : 0;
    if (fclose(f) && !e) e = errno;
    const char *what = "write failed";
    if (!e && rename(tmp, path)) e = errno, what = "cannot replace it";
    if (e) {
        unlink(tmp);
        snprintf(err, errlen, "%s: %s: %s", path, what, strerror(e));
        return -1;
    }
    return 0;
}

int compare_write(const char *path, const CompareRow *rows, int n, const char *title, char *err, size_t errlen) {
    int fmt = compare_format(path, err, errlen);
    return fmt < 0 ? -1 : write_file(path, (CompareFormat)fmt, rows, n, title, err, errlen);
}

