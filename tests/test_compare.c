/* test_compare.c: -m compare's output files (eval/compare_out.c) from
 * made-up rows, no model needed: CSV and JSON read back to the same
 * numbers (CSV by a small RFC 4180 reader here, JSON by format/json.h), the
 * SVG is well-formed XML with its labels where compare_layout put them, no
 * two label boxes collide, KL 0 sits on the axis, the title is the model's
 * last path component, and a bad name or folder fails with one line and
 * leaves no file. Each test writes into its own temporary folder. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eval/compare.h"
#include "format/json.h"
#include "tests/util.h"

static const char *FIELDS[] = {"name",      "weights", "k_bits", "v_bits", "bytes_per_token", "ratio_f16",
                               "ppl",       "dppl_pct", "kl",    "top1",   "greedy",          "decode_tps"};

/* A row whose numbers all differ and need every digit (thirds, sevenths). */
static CompareRow row(const char *name, const char *weights, double bits, double kl) {
    CompareRow r;
    memset(&r, 0, sizeof r);
    snprintf(r.name, sizeof r.name, "%s", name);
    r.weights = weights;
    r.k_bits = bits, r.v_bits = bits;
    r.bytes_per_token = bits * 384;
    r.ratio_f16 = 16.0 / bits;
    r.ppl = 15.861 + kl * 7 / 3;
    r.dppl_pct = 100 * kl / 7;
    r.kl = kl;
    r.top1 = 1 - kl / 3;
    r.greedy = 0.875;
    r.decode_tps = 2000 + 1.0 / 7;
    return r;
}

static double *num(CompareRow *r, int j) {
    double *v[] = {&r->k_bits, &r->v_bits, &r->bytes_per_token, &r->ratio_f16, &r->ppl,
                   &r->dppl_pct, &r->kl,     &r->top1,           &r->greedy,    &r->decode_tps};
    return v[j];
}

/* The same double, NaN included. */
static int same(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

/* ---- files ---- */

static char *temp_dir(void) {
    char *d = strdup("/tmp/test_compare.XXXXXX");
    cr_assert(d && mkdtemp(d), "mkdtemp failed");
    return d;
}

/* Entries of folder d, "." and ".." aside. */
static int entries(const char *d) {
    DIR *dir = opendir(d);
    cr_assert(dir, "cannot open %s", d);
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(dir);
    return n;
}

/* Removes folder d and what the tests put in it (files and empty folders). */
static void remove_dir(char *d) {
    DIR *dir = opendir(d);
    for (struct dirent *e; dir && (e = readdir(dir));) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", d, e->d_name);
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && remove(p)) rmdir(p);
    }
    if (dir) closedir(dir);
    rmdir(d);
    free(d);
}

/* Writes rows to dir/name, which must succeed; returns the file's text. */
static char *write_read(const char *dir, const char *name, const CompareRow *r, int n, const char *title) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(compare_write(path, r, n, title, err, sizeof err), 0, "%s", err);
    return slurp(path, NULL);
}

/* ---- CSV ---- */

/* One RFC 4180 field from *s (quoted fields may hold commas, doubled quotes
 * and line breaks) into out; *s moves past its comma or line end. Returns
 * 1 when the record goes on, 0 at its end. */
static int csv_field(const char **s, char *out, size_t cap) {
    const char *p = *s;
    size_t o = 0;
    if (*p == '"') {
        for (p++; !(p[0] == '"' && p[1] != '"'); p++) {
            cr_assert(*p, "unterminated quoted field");
            if (*p == '"') p++;
            if (o + 1 < cap) out[o++] = *p;
        }
        p++;
    } else
        for (; *p && *p != ',' && *p != '\n'; p++)
            if (o + 1 < cap) out[o++] = *p;
    out[o] = 0;
    cr_assert(*p == ',' || *p == '\n', "a field must end at a comma or a line end, found 0x%02x", *p);
    *s = p + 1;
    return *p == ',';
}

/* Rows that need quoting, full precision, and every kind of double. */
static int tricky_rows(CompareRow *r) {
    r[0] = row("f32", "stored", 32, 0);
    r[1] = row("q8,q4", "act bf16", 6.5, 1.0 / 3);
    r[2] = row("say \"hi\"", "q8", 4.125, 1e-300);
    r[3] = row("two\nlines", "stored", 2.125, 0.019121119398160167);
    r[4] = row("nan, inf", "stored", 3, 5e-9);
    r[4].decode_tps = NAN, r[4].ppl = INFINITY, r[4].dppl_pct = -INFINITY, r[4].top1 = -0.0;
    return 5;
}

Test(compare, csv_reads_back_every_field) {
    CompareRow r[8];
    int n = tricky_rows(r);
    char *dir = temp_dir(), *text = write_read(dir, "rows.csv", r, n, "models/x");
    const char *s = text;
    char field[256];
    for (int j = 0; j < 12; j++) {
        int more = csv_field(&s, field, sizeof field);
        cr_expect_str_eq(field, FIELDS[j]);
        cr_assert_eq(more, j < 11, "header: 12 fields");
    }
    for (int i = 0; i < n; i++) {
        csv_field(&s, field, sizeof field);
        cr_expect_str_eq(field, r[i].name, "row %d", i);
        csv_field(&s, field, sizeof field);
        cr_expect_str_eq(field, r[i].weights, "row %d", i);
        for (int j = 0; j < 10; j++) {
            int more = csv_field(&s, field, sizeof field);
            char *end;
            double v = strtod(field, &end);
            cr_expect(*field && !*end, "row %d %s: '%s' is not a number", i, FIELDS[j + 2], field);
            cr_expect(same(v, *num(&r[i], j)), "row %d %s: read %.17g, wrote %.17g", i, FIELDS[j + 2], v,
                      *num(&r[i], j));
            cr_assert_eq(more, j < 9, "row %d: 12 fields", i);
        }
    }
    cr_expect_eq(*s, 0, "nothing after the rows: %s", s);
    free(text);
    remove_dir(dir);
}

/* ---- JSON ---- */

Test(compare, json_reads_back_every_field) {
    CompareRow r[8];
    int n = tricky_rows(r);
    /* a control character and a byte that is not UTF-8 */
    snprintf(r[2].name, sizeof r[2].name, "bell\x07 \xff");
    char *dir = temp_dir(), path[512], err[512];
    snprintf(path, sizeof path, "%s/rows.json", dir);
    cr_assert_eq(compare_write(path, r, n, "/work/main/models/qwen3-kjv-mtp/", err, sizeof err), 0, "%s", err);
    Json *j = json_parse_file(path, 1 << 20, err, sizeof err);
    cr_assert(j, "not valid JSON: %s", err);
    cr_expect_str_eq(json_get_str(j, "title"), "qwen3-kjv-mtp");
    const Json *rows = json_get(j, "rows");
    cr_assert(rows && rows->type == JSON_ARRAY && rows->len == (size_t)n);
    for (int i = 0; i < n; i++) {
        const Json *o = json_at(rows, (size_t)i);
        cr_assert_eq(o->len, 12, "row %d: 12 members", i);
        for (size_t k = 0; k < 12; k++) cr_expect_str_eq(o->keys[k], FIELDS[k], "row %d", i);
        /* the bell comes back from \u0007, the stray byte as U+FFFD */
        cr_expect_str_eq(json_get_str(o, "name"), i == 2 ? "bell\x07 \xEF\xBF\xBD" : r[i].name, "row %d", i);
        cr_expect_str_eq(json_get_str(o, "weights"), r[i].weights, "row %d", i);
        for (int k = 0; k < 10; k++) {
            const Json *v = json_get(o, FIELDS[k + 2]);
            double want = *num(&r[i], k);
            if (!isfinite(want)) {
                cr_expect(v && v->type == JSON_NULL, "row %d %s: JSON has no NaN or infinity: null", i, FIELDS[k + 2]);
                continue;
            }
            cr_expect(v && v->type == JSON_NUMBER && v->number == want, "row %d %s: read %.17g, wrote %.17g", i,
                      FIELDS[k + 2], v ? v->number : NAN, want);
        }
    }
    json_free(j);
    remove_dir(dir);
}

/* ---- SVG ---- */

/* Whether s starts a character reference XML knows without a DTD. */
static int xml_entity(const char *s) {
    static const char *known[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#39;"};
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
        if (!strncmp(s, known[k], strlen(known[k]))) return 1;
    return 0;
}

/* Checks text as XML: one root element <svg>, tags balanced and named
 * alike, attributes quoted, no raw '<' or '&' in text or attribute values,
 * no control characters but line ends, valid UTF-8 (U+FFFD allowed). */
static void expect_well_formed(const char *x) {
    const char *stack[64];
    size_t stack_len[64];
    int depth = 0, roots = 0;
    for (const unsigned char *u = (const unsigned char *)x; *u; u++)
        cr_assert(*u >= 0x20 || *u == '\n', "control byte 0x%02x at %td", *u, (const char *)u - x);
    for (const char *p = x; *p;) {
        if (*p == '&') {
            cr_assert(xml_entity(p), "raw '&' at %td: %.20s", p - x, p);
            p++;
            continue;
        }
        if (*p != '<') {
            p++;
            continue;
        }
        if (p[1] == '/') {
            cr_assert(depth > 0, "closing tag with none open at %td", p - x);
            size_t len = strcspn(p + 2, ">");
            cr_assert(len == stack_len[depth - 1] && !strncmp(p + 2, stack[depth - 1], len),
                      "</%.*s> closes <%.*s> at %td", (int)len, p + 2, (int)stack_len[depth - 1], stack[depth - 1],
                      p - x);
            depth--;
            p += 2 + len + 1;
            continue;
        }
        const char *name = ++p;
        size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyz");
        cr_assert(len > 0, "'<' that starts no tag at %td: %.20s", p - 1 - x, p - 1);
        if (depth == 0) {
            roots++;
            cr_expect(len == 3 && !strncmp(name, "svg", 3), "root is not <svg>");
        }
        p += len;
        for (;;) {
            p += strspn(p, " \n");
            if (*p == '>' || !strncmp(p, "/>", 2)) break;
            size_t an = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789-:");
            cr_assert(an > 0 && p[an] == '=' && p[an + 1] == '"', "bad attribute at %td: %.30s", p - x, p);
            p += an + 2;
            for (; *p != '"'; p++) {
                cr_assert(*p && *p != '<', "'<' or end in an attribute value at %td", p - x);
                if (*p == '&') cr_assert(xml_entity(p), "raw '&' in an attribute at %td", p - x);
            }
            p++;
        }
        if (*p == '>') {
            cr_assert(depth < 64);
            stack[depth] = name, stack_len[depth++] = len;
            p++;
        } else
            p += 2;
    }
    cr_expect_eq(depth, 0, "%d elements left open", depth);
    cr_expect_eq(roots, 1, "%d root elements", roots);
}

/* The text of the first <text> element, entities undone. */
static void svg_title(const char *svg, char *out, size_t cap) {
    const char *t = strstr(svg, "<text");
    cr_assert(t);
    t = strchr(t, '>') + 1;
    size_t o = 0;
    for (; *t != '<' && o + 1 < cap; t++) {
        static const char *ent[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&#39;"}, chr[] = "&<>\"'";
        int k = 0;
        while (k < 5 && strncmp(t, ent[k], strlen(ent[k]))) k++;
        if (k < 5) t += strlen(ent[k]) - 1;
        out[o++] = k < 5 ? chr[k] : *t;
    }
    out[o] = 0;
}

Test(compare, svg_is_well_formed_xml) {
    CompareRow r[8];
    int n = tricky_rows(r);
    snprintf(r[1].name, sizeof r[1].name, "<q8> & 'q4'");
    snprintf(r[2].name, sizeof r[2].name, "bell\x07 \xff");
    char *dir = temp_dir(), *svg = write_read(dir, "plot.svg", r, n, "models/a&b <c> \"d\" 'e'"), title[128];
    expect_well_formed(svg);
    svg_title(svg, title, sizeof title);
    cr_expect_str_eq(title, "a&b <c> \"d\" 'e'");
    cr_expect(strstr(svg, "&lt;q8&gt; &amp; &#39;q4&#39;"), "label escaped");
    /* the stray byte and the bell: U+FFFD each, the rest kept */
    cr_expect(strstr(svg, ">bell\xEF\xBF\xBD \xEF\xBF\xBD"), "bytes that XML cannot hold replaced");
    free(svg);
    remove_dir(dir);
}

/* ---- layout ---- */

/* Bits and KL of the shipped model's rows (README, 448 tokens) and of a
 * run with K/V pairs added: the clusters around 4 bits are the hard part. */
static int shipped_rows(CompareRow *r) {
    static const struct {
        const char *name;
        double bits, kl;
    } t[] = {{"f32", 32, 0},
             {"f16", 16, 8.597226650508272e-09},
             {"q8", 8.5, 5.906355635004103e-06},
             {"q4", 4.5, 0.001014197673911505},
             {"q4h", 4.5, 0.0010675152689555414},
             {"tbq4", 4.125, 0.0010651869929571751},
             {"tbq3", 3.125, 0.004910188475255173},
             {"tbq2", 2.125, 0.019121119398160167},
             {"polar4", 4.25, 0.0009072708027981271},
             {"lm3", 3.25, 0.01066542752189811},
             {"kivi2", 15, 0.0006789475856234777},
             {"kivi4", 17, 1.930644164881687e-05},
             {"q8,q4", 6.5, 0.00048261450938920933},
             {"q4,q8", 6.5, 0.0005310305207352438},
             {"tbq4,tbq3", 3.625, 0.0036065989327101504},
             {"tbq3,tbq4", 3.625, 0.0024},
             {"q8,tbq4", 6.3125, 0.00062},
             {"tbq4,q8", 6.3125, 0.00045},
             {"polar4,q4", 4.375, 0.00081},
             {"q4,tbq4", 4.3125, 0.00117}};
    int n = sizeof t / sizeof t[0];
    for (int i = 0; i < n; i++) r[i] = row(t[i].name, "stored", t[i].bits, t[i].kl);
    return n;
}

static double overlap(CompareBox a, CompareBox b) {
    double w = fmin(a.x + a.w, b.x + b.w) - fmax(a.x, b.x), h = fmin(a.y + a.h, b.y + b.h) - fmax(a.y, b.y);
    return w > 0 && h > 0 ? w * h : 0;
}

static double dist(CompareBox b, double x, double y) {
    return hypot(fmax(fmax(b.x - x, x - b.x - b.w), 0), fmax(fmax(b.y - y, y - b.y - b.h), 0));
}

/* No two label boxes overlap, none covers a dot, all lie in the frame. */
static void expect_no_collisions(const CompareRow *r, int n, const char *what) {
    ComparePlot p;
    CompareLabel l[64];
    cr_assert_eq(compare_layout(r, n, &p, l), 0);
    for (int i = 0; i < n; i++) {
        cr_assert(l[i].shown, "%s: %s drawn", what, l[i].text);
        CompareBox b = l[i].box, a = p.area;
        cr_expect(b.x >= a.x && b.y >= a.y && b.x + b.w <= a.x + a.w && b.y + b.h <= a.y + a.h,
                  "%s: label %s outside the frame", what, l[i].text);
        for (int k = 0; k < n; k++) {
            cr_expect(dist(b, l[k].px, l[k].py) >= COMPARE_DOT, "%s: label %s covers the dot of %s", what, l[i].text,
                      l[k].text);
            if (k > i)
                cr_expect(overlap(b, l[k].box) == 0, "%s: labels %s and %s overlap", what, l[i].text, l[k].text);
        }
    }
}

Test(compare, labels_do_not_collide) {
    CompareRow r[64];
    int n = shipped_rows(r);
    expect_no_collisions(r, 12, "every scheme");
    expect_no_collisions(r, n, "20 rows");
    expect_no_collisions(r, 2, "2 rows");
    CompareRow three[] = {r[0], r[1], r[2], r[5]};
    expect_no_collisions(three, 4, "-kv f16,q8,tbq4");
    /* -wq q8: f32 twice, names longer */
    CompareRow wq[] = {row("f32", "stored", 32, 0), row("f32", "q8", 32, 1.23e-5), row("f16", "q8", 16, 1.22e-5),
                       row("q8", "q8", 8.5, 1.8e-5), row("tbq4", "q8", 4.125, 1.1e-3)};
    expect_no_collisions(wq, 5, "-wq q8");
    /* eight points within a few px of each other */
    static const char *names[] = {"a", "bb", "ccc", "dddd", "e", "ff", "ggg", "hhhh"};
    for (int i = 0; i < 8; i++) r[i] = row(names[i], "stored", 4 + 0.02 * i, 1e-3 * (1 + 0.01 * i));
    expect_no_collisions(r, 8, "a cluster of 8");
}

Test(compare, svg_draws_the_layout) {
    CompareRow r[64];
    int n = shipped_rows(r);
    ComparePlot p;
    CompareLabel l[64];
    cr_assert_eq(compare_layout(r, n, &p, l), 0);
    char *dir = temp_dir(), *svg = write_read(dir, "plot.svg", r, n, "m");
    expect_well_formed(svg);
    for (int i = 0; i < n; i++) {
        char want[256];
        snprintf(want, sizeof want, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"", l[i].tx, l[i].ty,
                 (const char *[]){"start", "middle", "end"}[l[i].anchor]);
        const char *t = strstr(svg, want);
        cr_expect(t, "label %s not drawn as laid out (%s)", l[i].text, want);
        if (t) cr_expect(!strncmp(strchr(t, '>') + 1, l[i].text, strlen(l[i].text)), "label %s's text", l[i].text);
        snprintf(want, sizeof want, "<circle cx=\"%.1f\" cy=\"%.1f\"", l[i].px, l[i].py);
        cr_expect(strstr(svg, want), "dot of %s not drawn", l[i].text);
    }
    free(svg);
    remove_dir(dir);
}

Test(compare, zero_kl_sits_on_the_axis) {
    CompareRow r[64];
    int n = shipped_rows(r);
    r[n++] = row("f32", "act bf16", 32, 0);
    ComparePlot p;
    CompareLabel l[64];
    cr_assert_eq(compare_layout(r, n, &p, l), 0);
    double bottom = p.area.y + p.area.h;
    cr_expect(p.has_zero);
    for (int i = 0; i < n; i++) {
        if (r[i].kl == 0) {
            cr_expect(l[i].at_zero && l[i].py == bottom, "%s: KL 0 at y %g, the axis at %g", l[i].text, l[i].py,
                      bottom);
            const char *tail = l[i].text + strlen(l[i].text) - 6;
            cr_expect_str_eq(tail, ", KL 0", "%s", l[i].text);
        } else
            cr_expect(!l[i].at_zero && l[i].py <= p.y_log0 + 1e-9 && l[i].py >= p.area.y, "%s: KL %g at y %g",
                      l[i].text, r[i].kl, l[i].py);
    }
    /* the bottom decade is f16's (9e-9), not a floor made up for KL 0 */
    cr_expect_eq(p.lk0, -9);
    char *dir = temp_dir(), *svg = write_read(dir, "plot.svg", r, n, "m");
    cr_expect(strstr(svg, ">f32, KL 0</text>") && strstr(svg, ">f32, weights act bf16, KL 0</text>"));
    cr_expect(!strstr(svg, ">1e-10<"), "no decade below the data's");
    free(svg);
    /* without a zero row the lowest decade is the bottom edge */
    cr_assert_eq(compare_layout(r + 1, 5, &p, l), 0);
    cr_expect(!p.has_zero && p.y_log0 == p.area.y + p.area.h);
    remove_dir(dir);
}

Test(compare, title_is_the_last_path_component) {
    static const char *paths[][2] = {{"/work/main/models/qwen3-kjv-mtp", "qwen3-kjv-mtp"},
                                     {"models/qwen3-kjv-mtp/", "qwen3-kjv-mtp"},
                                     {"qwen3-kjv-mtp", "qwen3-kjv-mtp"},
                                     {"/m/Qwen3-0.6B/model.safetensors", "model.safetensors"},
                                     {"/", "/"}};
    CompareRow r[2] = {row("f32", "stored", 32, 0), row("q8", "stored", 8.5, 6e-6)};
    char *dir = temp_dir(), err[512], path[512], title[128];
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        char *svg = write_read(dir, "plot.svg", r, 2, paths[i][0]);
        svg_title(svg, title, sizeof title);
        cr_expect_str_eq(title, paths[i][1], "SVG title of %s", paths[i][0]);
        free(svg);
        snprintf(path, sizeof path, "%s/rows.json", dir);
        cr_assert_eq(compare_write(path, r, 2, paths[i][0], err, sizeof err), 0, "%s", err);
        Json *j = json_parse_file(path, 1 << 20, err, sizeof err);
        cr_assert(j, "%s", err);
        cr_expect_str_eq(json_get_str(j, "title"), paths[i][1], "JSON title of %s", paths[i][0]);
        json_free(j);
    }
    remove_dir(dir);
}

/* One line naming path, and the three extensions when refusing a name. */
static void expect_one_line(const char *err, const char *path, int names_formats) {
    cr_expect(*err && !strchr(err, '\n'), "one line: '%s'", err);
    cr_expect(strstr(err, path), "'%s' names %s", err, path);
    if (names_formats) cr_expect(strstr(err, ".svg") && strstr(err, ".csv") && strstr(err, ".json"), "%s", err);
}

Test(compare, unknown_extension_refused) {
    char *dir = temp_dir(), path[512], err[512];
    CompareRow r[1] = {row("f32", "stored", 32, 0)};
    static const char *bad[] = {"plot.png", "plot", "plot.svg.bak", "plot.", "d.svg/plot", "plot.svgz"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, bad[i]);
        err[0] = 0;
        cr_expect_eq(compare_format(path, err, sizeof err), -1, "%s", bad[i]);
        expect_one_line(err, path, 1);
        err[0] = 0;
        cr_expect_eq(compare_write(path, r, 1, "m", err, sizeof err), -1, "%s", bad[i]);
        expect_one_line(err, path, 1);
    }
    cr_expect_eq(entries(dir), 0, "a refused name writes nothing");
    cr_expect_eq(compare_format("a/plot.svg", err, sizeof err), COMPARE_SVG);
    cr_expect_eq(compare_format("plot.CSV", err, sizeof err), COMPARE_CSV);
    cr_expect_eq(compare_format("x.y/rows.Json", err, sizeof err), COMPARE_JSON);
    remove_dir(dir);
}

Test(compare, failed_write_leaves_no_file) {
    char *dir = temp_dir(), path[512], err[512];
    CompareRow r[2] = {row("f32", "stored", 32, 0), row("q8", "stored", 8.5, 6e-6)};
    static const char *names[] = {"plot.svg", "rows.csv", "rows.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/missing/%s", dir, names[i]);
        err[0] = 0;
        cr_expect_eq(compare_write(path, r, 2, "m", err, sizeof err), -1, "%s", path);
        expect_one_line(err, path, 0);
        /* a folder where the file should go: the rename fails, the
         * temporary file goes */
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        cr_assert_eq(mkdir(path, 0755), 0);
        err[0] = 0;
        cr_expect_eq(compare_write(path, r, 2, "m", err, sizeof err), -1, "%s", path);
        expect_one_line(err, path, 0);
        struct stat st;
        cr_expect(stat(path, &st) == 0 && S_ISDIR(st.st_mode), "the folder is left as it was");
        cr_expect_eq(entries(dir), 1, "only the folder %s in %s", names[i], dir);
        rmdir(path);
    }
    /* an existing file is replaced whole, nothing left beside it */
    snprintf(path, sizeof path, "%s/rows.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("not json, and longer than nothing at all", f);
    fclose(f);
    cr_assert_eq(compare_write(path, r, 2, "m", err, sizeof err), 0, "%s", err);
    Json *j = json_parse_file(path, 1 << 20, err, sizeof err);
    cr_expect(j, "%s", err);
    json_free(j);
    cr_expect_eq(entries(dir), 1);
    remove_dir(dir);
}

/* An infinite KL on the axes would never finish drawing its decades. */
Test(compare, crowds_and_odd_values_stay_in_the_frame, .timeout = 30) {
    /* 64 rows (the most run.c writes), 59 on one spot by the frame's top
     * right corner: labels may overlap then, but stay in the frame; rows
     * the axes cannot hold are not drawn */
    CompareRow r[64];
    for (int i = 0; i < 64; i++) {
        char name[16];
        snprintf(name, sizeof name, "s%d", i);
        r[i] = row(name, "stored", 4.9, 9.9e-3);
    }
    r[59] = row("s59", "stored", 1, 1e-6);
    r[60].kl = NAN, r[61].kl = INFINITY, r[62].k_bits = r[62].v_bits = 0, r[63].kl = -1e-12;
    ComparePlot p;
    CompareLabel l[64];
    cr_assert_eq(compare_layout(r, 64, &p, l), 0);
    for (int i = 0; i < 64; i++) {
        cr_expect_eq(l[i].shown, i < 60 || i == 63, "row %d", i);
        if (!l[i].shown) continue;
        CompareBox b = l[i].box, a = p.area;
        cr_expect(b.x >= a.x && b.y >= a.y && b.x + b.w <= a.x + a.w && b.y + b.h <= a.y + a.h, "%s", l[i].text);
    }
    cr_expect(l[63].at_zero && !strcmp(l[63].text, "s63, KL -1e-12"), "%s", l[63].text);
    char *dir = temp_dir(), *svg = write_read(dir, "plot.svg", r, 64, "m");
    expect_well_formed(svg);
    free(svg);
    remove_dir(dir);
}
