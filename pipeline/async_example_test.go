package pipeline_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/source"
)

// ExampleOrderedWait looks up each order's customer name in an HTTP
// service, up to 10 requests in flight, each attempt bounded to a second
// and retried twice: the enriched orders come out in input order.
func ExampleOrderedWait() {
	names := map[string]string{"c1": "Ada", "c2": "Grace", "c3": "Edsger"}
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(5 * time.Millisecond) // the service's latency
		fmt.Fprint(w, names[r.URL.Query().Get("id")])
	}))
	defer svc.Close()
	client := svc.Client()

	type order struct{ ID, Customer string }
	lookup := func(ctx context.Context, o order) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, svc.URL+"/?id="+o.Customer, nil)
		if err != nil {
			return "", err
		}
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		name, err := io.ReadAll(resp.Body)
		return o.ID + " " + string(name), err
	}

	job := pipeline.New("enrich")
	orders := pipeline.FromSource(job, "orders", source.NewSlice([]order{
		{"o1", "c2"}, {"o2", "c1"}, {"o3", "c3"}, {"o4", "c1"},
	}, 1))
	enriched := pipeline.OrderedWait(orders, "customer", lookup,
		pipeline.Parallelism(1), pipeline.AsyncCapacity(10), pipeline.AsyncTimeout(time.Second),
		pipeline.Retry(3, 10*time.Millisecond, 100*time.Millisecond))
	var out strings.Builder
	pipeline.To(enriched, "print", sink.NewStdout(&out, func(s string) string { return s }))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(out.String())
	// Output:
	// o1 Grace
	// o2 Ada
	// o3 Edsger
	// o4 Ada
}
