package poolv1

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
)

// ListPageSize is the page size ListAll asks for.
const ListPageSize = 1000

// ListAll calls List page after page, starting from req (its PageToken,
// "" for the first segment), and returns every segment in the daemon's
// order. A req without a PageSize asks for ListPageSize. Each page's call
// has perPage to answer (0: ctx alone bounds them). It stops at the first
// error. req is not modified.
func ListAll(ctx context.Context, c PoolClient, req *ListRequest, perPage time.Duration, opts ...grpc.CallOption) ([]*Segment, error) {
	page := &ListRequest{All: req.All, PageSize: req.PageSize, PageToken: req.PageToken}
	if page.PageSize == 0 {
		page.PageSize = ListPageSize
	}
	var out []*Segment
	for {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if perPage > 0 {
			pctx, cancel = context.WithTimeout(ctx, perPage)
		}
		resp, err := c.List(pctx, page, opts...)
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Segments...)
		if resp.NextPageToken == "" {
			return out, nil
		}
		if resp.NextPageToken == page.PageToken {
			return nil, fmt.Errorf("list: the daemon answered page token %q with itself; the listing does not advance", page.PageToken)
		}
		page.PageToken = resp.NextPageToken
	}
}
