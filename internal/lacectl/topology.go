package lacectl

// lacectl topology: the networks and who may reach whom, as a table and as
// a drawing. Every answer comes from the reachability oracle
// (model.ViewOf); nothing here re-derives the rules of docs/topology.md.

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
)

// Topology prints the networks and, per source network, what it may reach
// and which peerings are refused. When svg is not nil it also receives the
// drawing (DrawTopology).
func Topology(ctx context.Context, c client.Client, out, svg io.Writer) error {
	t, err := ReadTopology(ctx, c)
	if err != nil {
		return err
	}
	if err := PrintTopology(out, t); err != nil {
		return err
	}
	if svg != nil {
		return DrawTopology(svg, t)
	}
	return nil
}

// ReadTopology lists what the oracle reads from the API.
func ReadTopology(ctx context.Context, c client.Client) (model.Topology, error) {
	var nets lacev1.NetworkList
	var nrps lacev1.NetworkRoutingPolicyList
	var srps lacev1.ServiceRoutingPolicyList
	for _, l := range []client.ObjectList{&nets, &nrps, &srps} {
		if err := c.List(ctx, l); err != nil {
			return model.Topology{}, fmt.Errorf("list %T: %w", l, err)
		}
	}
	return model.Topology{Networks: nets.Items, RoutingPolicies: nrps.Items, ServiceRoutingPolicies: srps.Items}, nil
}

// topoNet is one network as lacectl shows it.
type topoNet struct {
	name      string
	typ       lacev1.NetworkType
	id        int32
	anonymous bool
	prefixes  []string // subnets of a pod network, externalPrefixes of an external one
	// ready: the network has an ID, so the oracle knows it; view is only
	// meaningful then.
	ready bool
	view  model.View
}

// self says how a network reaches its own prefixes, for people.
func (n topoNet) self() string {
	switch {
	case !n.ready:
		return "no ID yet: not in the data plane"
	case n.view.Closed:
		return "closed: anonymous, no self policy"
	case n.anonymous:
		return "opened to itself by " + n.view.SelfPolicy
	}
	return "reaches itself (own network)"
}

// topoEdge is one peering of a source network: granted (in its view) or
// refused (a PeeringConflict).
type topoEdge struct {
	from, to, policy string
	refused          bool
	conflict         model.Conflict
}

type topoGraph struct {
	nets  []topoNet // by name
	edges []topoEdge
	srps  []string
}

func buildGraph(t model.Topology) topoGraph {
	var g topoGraph
	for _, n := range t.Networks {
		tn := topoNet{name: n.Name, typ: n.Spec.Type, id: n.Status.ID, anonymous: model.IsAnonymous(&n), ready: n.Status.ID > 0}
		if tn.typ == "" {
			tn.typ = lacev1.NetworkTypeL3
		}
		if n.Spec.Type == lacev1.NetworkTypeExternal {
			for _, p := range n.Spec.ExternalPrefixes {
				tn.prefixes = append(tn.prefixes, string(p))
			}
		} else {
			for _, s := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
				if s != nil {
					tn.prefixes = append(tn.prefixes, string(s.Prefix))
				}
			}
		}
		g.nets = append(g.nets, tn)
	}
	sort.Slice(g.nets, func(i, j int) bool { return g.nets[i].name < g.nets[j].name })
	for i := range g.nets {
		n := &g.nets[i]
		if !n.ready {
			continue
		}
		n.view = model.ViewOf(t, n.name)
		seen := map[string]bool{n.name: true}
		for _, e := range n.view.Entries {
			if seen[e.Network] {
				continue
			}
			seen[e.Network] = true
			g.edges = append(g.edges, topoEdge{from: n.name, to: e.Network, policy: e.Policy})
		}
		for _, c := range n.view.Refused {
			g.edges = append(g.edges, topoEdge{from: n.name, to: c.Dst, policy: c.Policy, refused: true, conflict: c})
		}
	}
	for _, p := range t.ServiceRoutingPolicies {
		g.srps = append(g.srps, p.Name)
	}
	sort.Strings(g.srps)
	return g
}

// PrintTopology writes the networks table, then per source network every
// prefix it may reach and by which rule, refused peerings marked REFUSED,
// then the refused peerings in full.
func PrintTopology(out io.Writer, t model.Topology) error {
	g := buildGraph(t)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tTYPE\tID\tSUBNETS / EXTERNAL PREFIXES\tANONYMOUS")
	for _, n := range g.nets {
		id := "-"
		if n.ready {
			id = fmt.Sprint(n.id)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\n", n.name, n.typ, id, dash(strings.Join(n.prefixes, ",")), n.anonymous)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tMAY REACH\tPREFIX\tVIA")
	var refused []model.Conflict
	for _, n := range g.nets {
		if !n.ready {
			fmt.Fprintf(tw, "%s\t-\t-\t%s\n", n.name, n.self())
			continue
		}
		if n.view.Closed {
			for _, p := range n.prefixes {
				fmt.Fprintf(tw, "%s\t%s\t%s\tCLOSED: anonymous network without a self policy\n", n.name, n.name, p)
			}
		}
		for _, e := range n.view.Entries {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.name, e.Network, e.Prefix, via(n.name, e))
		}
		for _, c := range n.view.Refused {
			fmt.Fprintf(tw, "%s\t%s\t%s\tREFUSED: NetworkRoutingPolicy %s, overlaps %s %s (PeeringConflict)\n",
				n.name, c.Dst, c.Prefix, c.Policy, c.With, c.WithPrefix)
			refused = append(refused, c)
		}
		if len(n.view.Entries) == 0 && len(n.view.Refused) == 0 && !n.view.Closed {
			fmt.Fprintf(tw, "%s\t-\t-\tnothing\n", n.name)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(out)
	if len(refused) == 0 {
		fmt.Fprintln(out, "refused peerings: none")
	} else {
		fmt.Fprintf(out, "refused peerings (PeeringConflict): %d\n", len(refused))
		for _, c := range refused {
			fmt.Fprintf(out, "  %s\n", c)
		}
	}
	if len(g.srps) > 0 {
		fmt.Fprintf(out, "service routing policies: %s (their VIP grants are not shown yet: the model does not read them)\n",
			strings.Join(g.srps, ", "))
	}
	return nil
}

func via(src string, e model.ViewEntry) string {
	switch {
	case e.Policy == "":
		return "own network"
	case e.Network == src:
		return "NetworkRoutingPolicy " + e.Policy + " (opens the anonymous network to itself)"
	}
	return "NetworkRoutingPolicy " + e.Policy
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Drawing. The layout is fixed by the input alone: networks by name on a
// circle starting at the top, clockwise, every box the same size; a
// peering is a quadratic curve bent to the right of its direction, so the
// two directions of a pair do not cover each other. Coordinates are
// printed with one decimal.

const (
	svgFont      = 12.0
	svgCharW     = 7.3 // monospace advance at svgFont, a little generous
	svgLineH     = 16.0
	svgPad       = 10.0
	svgMargin    = 40.0
	svgTitleH    = 30.0
	svgLegendH   = 70.0
	colorEdge    = "#444444"
	colorRefused = "#d62728"
)

type pt struct{ x, y float64 }

func (p pt) add(q pt) pt      { return pt{p.x + q.x, p.y + q.y} }
func (p pt) sub(q pt) pt      { return pt{p.x - q.x, p.y - q.y} }
func (p pt) mul(k float64) pt { return pt{p.x * k, p.y * k} }
func (p pt) len() float64     { return math.Hypot(p.x, p.y) }
func (p pt) String() string   { return fmt.Sprintf("%.1f,%.1f", p.x, p.y) }
func f1(v float64) string     { return fmt.Sprintf("%.1f", v) }
func textW(s string) float64  { return float64(len([]rune(s))) * svgCharW }
func boxLines(n topoNet) []string {
	return append(append([]string{n.name, boxKind(n)}, n.prefixes...), n.self())
}

func boxKind(n topoNet) string {
	s := string(n.typ)
	if n.ready {
		s += fmt.Sprintf("  id %d", n.id)
	}
	if n.anonymous {
		s += "  anonymous"
	}
	return s
}

// boxExit is where the ray from the box centre c toward q leaves the box of
// half sizes hw, hh.
func boxExit(c, q pt, hw, hh float64) pt {
	d := q.sub(c)
	t := math.Inf(1)
	if d.x != 0 {
		t = math.Min(t, hw/math.Abs(d.x))
	}
	if d.y != 0 {
		t = math.Min(t, hh/math.Abs(d.y))
	}
	if math.IsInf(t, 1) {
		return c
	}
	return c.add(d.mul(t))
}

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// DrawTopology writes a self-contained SVG of the topology: networks as
// boxes with their prefixes and how they reach themselves, granted
// peerings as dark arrows labelled with their policy, refused peerings as
// red dashed arrows. The same topology always gives the same bytes.
func DrawTopology(out io.Writer, t model.Topology) error {
	g := buildGraph(t)
	n := len(g.nets)

	// One box size for all: the widest line, the most lines.
	var maxW float64
	maxLines := 0
	for _, tn := range g.nets {
		lines := boxLines(tn)
		for _, l := range lines {
			maxW = math.Max(maxW, textW(l))
		}
		if len(lines) > maxLines {
			maxLines = len(lines)
		}
	}
	bw := math.Ceil(maxW + 2*svgPad)
	bh := math.Ceil(float64(maxLines)*svgLineH + 2*svgPad)

	// Radius: neighbours on the circle at least a box diagonal plus room
	// for a label and its arrows apart.
	r := 0.0
	if n > 1 {
		r = (math.Hypot(bw, bh) + 200) / (2 * math.Sin(math.Pi/float64(n)))
		r = math.Max(r, 180)
	}
	width := 2*r + bw + 2*svgMargin
	minW := 2 * svgMargin
	for _, l := range legendItems {
		minW += textW(l.text) + 60
	}
	width = math.Max(width, minW)
	height := svgTitleH + 2*r + bh + 2*svgMargin + svgLegendH
	center := pt{width / 2, svgTitleH + svgMargin + bh/2 + r}
	pos := map[string]pt{}
	for i, name := range circleOrder(g) {
		a := -math.Pi/2 + 2*math.Pi*float64(i)/float64(n)
		pos[name] = center.add(pt{r * math.Cos(a), r * math.Sin(a)})
	}
	pair := map[[2]string]bool{}
	for _, e := range g.edges {
		pair[[2]string{e.from, e.to}] = true
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="%s">
<title>Lace topology</title>
<defs>
<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="%s"/></marker>
<marker id="arrow-refused" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="%s"/></marker>
</defs>
<rect x="0" y="0" width="%s" height="%s" fill="#ffffff"/>
<text x="%s" y="%s" font-size="16" font-weight="bold">Lace topology: who may initiate traffic to whom</text>
`, f1(width), f1(height), f1(width), f1(height), f1(svgFont), colorEdge, colorRefused, f1(width), f1(height), f1(svgMargin/2), f1(svgMargin/2+8))

	// Boxes.
	for _, tn := range g.nets {
		p := pos[tn.name]
		fill, stroke, dash := "#e8f0fe", "#3b6fd8", ""
		if tn.typ == lacev1.NetworkTypeExternal {
			fill, stroke = "#e6f4ea", "#2e8b57"
		}
		if tn.anonymous {
			dash = ` stroke-dasharray="6,3"`
		}
		if !tn.ready {
			fill, stroke, dash = "#f1f1f1", "#999999", ` stroke-dasharray="2,3"`
		}
		fmt.Fprintf(&b, `<g class="network" data-network="%s">
<rect x="%s" y="%s" width="%s" height="%s" rx="6" fill="%s" stroke="%s" stroke-width="1.5"%s/>
`, esc(tn.name), f1(p.x-bw/2), f1(p.y-bh/2), f1(bw), f1(bh), fill, stroke, dash)
		x := p.x - bw/2 + svgPad
		y := p.y - bh/2 + svgPad + svgFont
		for i, l := range boxLines(tn) {
			attrs := ""
			switch {
			case i == 0:
				attrs = ` font-weight="bold" font-size="13"`
			case i == len(boxLines(tn))-1 && tn.ready && tn.view.Closed:
				attrs = ` fill="#8a5a00" font-style="italic"`
			case i == len(boxLines(tn))-1:
				attrs = ` fill="#555555" font-style="italic"`
			case i == 1:
				attrs = ` fill="#555555"`
			}
			fmt.Fprintf(&b, "<text x=\"%s\" y=\"%s\"%s>%s</text>\n", f1(x), f1(y), attrs, esc(l))
			y += svgLineH
		}
		b.WriteString("</g>\n")
	}

	// Edges, then their labels on top of everything.
	var labels bytes.Buffer
	for _, e := range g.edges {
		a, z := pos[e.from], pos[e.to]
		d := z.sub(a)
		l := d.len()
		if l == 0 {
			continue
		}
		ctl := bend(a, z, center, pair[[2]string{e.to, e.from}])
		start := boxExit(a, ctl, bw/2+2, bh/2+2)
		end := boxExit(z, ctl, bw/2+3, bh/2+3)
		color, marker, dash, class := colorEdge, "arrow", "", "peering"
		text := e.policy
		if e.refused {
			color, marker, dash, class = colorRefused, "arrow-refused", ` stroke-dasharray="7,4"`, "peering refused"
			text = fmt.Sprintf("REFUSED %s: overlaps %s %s", e.policy, e.conflict.With, e.conflict.WithPrefix)
		}
		fmt.Fprintf(&b, `<path class="%s" data-from="%s" data-to="%s" data-policy="%s" d="M%s Q%s %s" fill="none" stroke="%s" stroke-width="1.6"%s marker-end="url(#%s)"><title>%s</title></path>
`, class, esc(e.from), esc(e.to), esc(e.policy), start, ctl, end, color, dash, marker, esc(edgeTitle(e)))
		mid := start.mul(0.25).add(ctl.mul(0.5)).add(end.mul(0.25))
		tw := textW(text) + 8
		fmt.Fprintf(&labels, `<g class="label"><rect x="%s" y="%s" width="%s" height="16" rx="3" fill="#ffffff" fill-opacity="0.9" stroke="%s" stroke-width="0.6"/><text x="%s" y="%s" text-anchor="middle" font-size="11" fill="%s">%s</text></g>
`, f1(mid.x-tw/2), f1(mid.y-8), f1(tw), color, f1(mid.x), f1(mid.y+4), color, esc(text))
	}
	b.Write(labels.Bytes())

	// Legend.
	y := height - svgLegendH + 20
	x := svgMargin
	for _, li := range legendItems {
		b.WriteString(li.draw(x, y))
		fmt.Fprintf(&b, "<text x=\"%s\" y=\"%s\">%s</text>\n", f1(x+44), f1(y+4), esc(li.text))
		x += textW(li.text) + 60
	}
	fmt.Fprintf(&b, "<text x=\"%s\" y=\"%s\" fill=\"#555555\">%s</text>\n", f1(svgMargin), f1(y+30),
		esc("An arrow S -> D: S may initiate traffic to D; replies come back through conntrack. Nothing transits."))
	b.WriteString("</svg>\n")
	_, err := out.Write(b.Bytes())
	return err
}

// circleOrder places the networks on the circle: connected networks next
// to each other (breadth first from the first name of each group of
// networks linked by peerings, neighbours by name), networks without any
// peering last, by name.
func circleOrder(g topoGraph) []string {
	adj := map[string][]string{}
	for _, e := range g.edges {
		adj[e.from] = append(adj[e.from], e.to)
		adj[e.to] = append(adj[e.to], e.from)
	}
	for k := range adj {
		sort.Strings(adj[k])
	}
	var order, lonely []string
	seen := map[string]bool{}
	for _, tn := range g.nets {
		if seen[tn.name] {
			continue
		}
		if len(adj[tn.name]) == 0 {
			lonely = append(lonely, tn.name)
			seen[tn.name] = true
			continue
		}
		queue := []string{tn.name}
		seen[tn.name] = true
		for len(queue) > 0 {
			cur := queue[0]
			queue = queue[1:]
			order = append(order, cur)
			for _, nb := range adj[cur] {
				if !seen[nb] {
					seen[nb] = true
					queue = append(queue, nb)
				}
			}
		}
	}
	return append(order, lonely...)
}

// bend is the control point of the curve from a to z. A lone direction
// bows toward the centre of the circle, away from the boxes around it; the
// two directions of a pair bow by different amounts (or, across the
// centre, to either side) so that both arrows and their labels show.
func bend(a, z, center pt, reverse bool) pt {
	d := z.sub(a)
	l := d.len()
	mid := a.add(d.mul(0.5))
	in := center.sub(mid)
	if in.len() < 0.05*l {
		// Through the centre: to the right of the direction.
		k := 0.15
		if reverse {
			k = 0.2
		}
		return mid.add(pt{-d.y / l, d.x / l}.mul(k * l))
	}
	in = in.mul(1 / in.len())
	k := 0.18
	if reverse {
		// The same bow for both would draw one arrow over the other.
		k = 0.06
		if a.x > z.x || (a.x == z.x && a.y > z.y) {
			k = 0.3
		}
	}
	return mid.add(in.mul(k * l))
}

func edgeTitle(e topoEdge) string {
	if e.refused {
		return e.conflict.String()
	}
	return fmt.Sprintf("%s may reach %s (NetworkRoutingPolicy %s)", e.from, e.to, e.policy)
}

type legendItem struct {
	text string
	draw func(x, y float64) string
}

var legendItems = []legendItem{
	{"pod network", func(x, y float64) string {
		return fmt.Sprintf("<rect x=\"%s\" y=\"%s\" width=\"36\" height=\"14\" rx=\"3\" fill=\"#e8f0fe\" stroke=\"#3b6fd8\"/>\n", f1(x), f1(y-7))
	}},
	{"external network", func(x, y float64) string {
		return fmt.Sprintf("<rect x=\"%s\" y=\"%s\" width=\"36\" height=\"14\" rx=\"3\" fill=\"#e6f4ea\" stroke=\"#2e8b57\"/>\n", f1(x), f1(y-7))
	}},
	{"anonymous (dashed)", func(x, y float64) string {
		return fmt.Sprintf("<rect x=\"%s\" y=\"%s\" width=\"36\" height=\"14\" rx=\"3\" fill=\"#e8f0fe\" stroke=\"#3b6fd8\" stroke-dasharray=\"6,3\"/>\n", f1(x), f1(y-7))
	}},
	{"peering (policy)", func(x, y float64) string {
		return fmt.Sprintf("<path d=\"M%s,%s L%s,%s\" stroke=\"%s\" stroke-width=\"1.6\" marker-end=\"url(#arrow)\"/>\n", f1(x), f1(y), f1(x+36), f1(y), colorEdge)
	}},
	{"refused peering", func(x, y float64) string {
		return fmt.Sprintf("<path d=\"M%s,%s L%s,%s\" stroke=\"%s\" stroke-width=\"1.6\" stroke-dasharray=\"7,4\" marker-end=\"url(#arrow-refused)\"/>\n", f1(x), f1(y), f1(x+36), f1(y), colorRefused)
	}},
}
